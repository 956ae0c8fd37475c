"""Shared fixtures: a tiny local model, an isolated Prefect home, a fresh lake per test."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Prefect keeps its database under PREFECT_HOME; give the test session its own.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="thresher-prefect-"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Prefect logs to a console pytest has closed by the time its temporary server stops.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("THRESHER_LAKE", None)


@pytest.fixture
def lake(tmp_path):
    from thresher.stores.lake import Lake

    return Lake(tmp_path / "lake")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny Llama trained briefly on arithmetic, built once and cached by source hash."""
    from thresher.trainers import tiny

    steps = 150
    digest = hashlib.sha256(Path(tiny.__file__).read_bytes() + str(steps).encode()).hexdigest()
    out = ROOT / ".cache" / f"test-model-{digest[:12]}"
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".tmp")
        tiny.make_tiny_model(tmp, train_steps=steps)
        tmp.rename(out)
    return out
