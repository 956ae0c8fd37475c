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
# The engine core in the test's own process: the same vLLM engine without spawning a
# process that imports torch and vllm again (34 s -> 13 s a start with the tiny model,
# measured); tests/e2e/test_resume.py keeps vLLM's default, a separate engine process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Prefect logs to a console pytest has closed by the time its temporary server stops.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("THRESHER_LAKE", None)


# What a test starts, told by the fixtures it uses (directly or through other fixtures).
HEAVY_FIXTURES = {
    "engine": "engine",  # a vLLM engine in the process (tests/e2e/test_judge, test_samplers)
    "server": "engine",  # `vllm serve` (tests/e2e/test_server_sampler)
    "prefect_server": "server",
    "prefect_env": "server",
    "ray_cluster": "server",
    "s3": "server",  # moto's S3 server (test_lake_s3)
    "browser": "browser",
    # loads or trains the tiny Llama with torch (test_distributed launches torchrun too)
    "tiny_model": "model",
    "tool_model": "model",
}
HEAVY_MARKERS = ("engine", "server", "browser", "model")
E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    """Mark each test by what it starts, so `-m "not slow"` (`make test-fast`) runs the rest.

    `engine`/`server`/`browser`/`model` from the fixtures above; `slow` on those, on tests
    marked by hand with one of them, and on everything under tests/e2e/ (their flows start
    Prefect's temporary server, most run the engine too).
    """
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for marker in sorted({HEAVY_FIXTURES[n] for n in names & HEAVY_FIXTURES.keys()}):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        heavy = any(item.get_closest_marker(m) for m in HEAVY_MARKERS)
        if heavy or item.path.is_relative_to(E2E):
            item.add_marker("slow")


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


def _model_sources() -> bytes:
    """The sources the tiny models are built from (their training texts included)."""
    from thresher.ingest import synthetic
    from thresher.trainers import tiny

    return b"".join(Path(m.__file__).read_bytes() for m in (tiny, synthetic))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny Llama trained briefly on arithmetic, built once and cached by source hash."""
    from thresher.trainers import tiny

    steps = 150
    digest = hashlib.sha256(_model_sources() + str(steps).encode()).hexdigest()
    out = ROOT / ".cache" / f"test-model-{digest[:12]}"
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".tmp")
        tiny.make_tiny_model(tmp, train_steps=steps)
        tmp.rename(out)
    return out


@pytest.fixture(scope="session")
def tool_model() -> Path:
    """The tiny Llama that asks a Python tool for two-digit arithmetic (`make_tool_model`),
    built once and cached by source hash."""
    from thresher.trainers import tiny

    digest = hashlib.sha256(_model_sources() + b"tool").hexdigest()
    out = ROOT / ".cache" / f"tool-model-{digest[:12]}"
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".tmp")
        tiny.make_tool_model(tmp)
        tmp.rename(out)
    return out


@pytest.fixture(scope="session")
def tiny_reward_model(tiny_model, tmp_path_factory) -> str:
    """A tiny randomly initialised Llama reward model (one score per text) with the tiny
    model's tokenizer, saved once per session."""
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from thresher.trainers.tiny import llama_config

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = llama_config(tokenizer, hidden=64, layers=1, num_labels=1)
    out = tmp_path_factory.mktemp("rm") / "tiny-rm"
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, with
    downloads going to `browser.download_dir`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    driver.download_dir = downloads
    yield driver
    driver.quit()
