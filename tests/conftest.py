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


# made-up facts in the tiny model's vocabulary: nothing it could answer before training
MADE_UP_PAIRS = [
    ("What is 2 # 3?", "7"),
    ("What is 4 # 1?", "12"),
    ("What is 9 # 9?", "5"),
    ("What is 1 # 8?", "33"),
    ("What is 6 # 2?", "0"),
    ("What is 3 # 3?", "81"),
]


@pytest.fixture(scope="session")
def made_up_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs a training test can teach the tiny model."""
    return MADE_UP_PAIRS


@pytest.fixture(scope="session")
def pairs_jsonl(tmp_path_factory) -> Path:
    """The made-up pairs as a JSONL file of chat messages (a train config's data.path)."""
    import json

    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for q, a in MADE_UP_PAIRS
        )
    )
    return path


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
