"""Orchestration against a real Prefect server: the device concurrency limit, concurrent
curate runs into one lake, and what the flows publish."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from helpers import ingest_arithmetic

from thresher.stores.lake import Lake

HOLDER = textwrap.dedent(
    """
    import json, sys, time
    import prefect.concurrency.sync  # noqa: F401  (imported before the start signal)
    from thresher.flows.slots import ensure_limit, gpu_slot
    ensure_limit()
    print("ready", flush=True)
    sys.stdin.readline()  # both ask for the slot once the test says go
    with gpu_slot("test"):
        began = time.time()
        time.sleep(4.0)
        ended = time.time()
    print(json.dumps([began, ended]), flush=True)
    """
)


def _hold_twice(env: dict[str, str]) -> list[list[float]]:
    """Two processes each hold a device slot for 4 s, asking at the same moment.

    Each imports Prefect and reaches the server first, then waits for the go, so a slow
    interpreter start on a busy machine does not stagger the two requests. The hold is
    longer than gpu_slot's 2 s first try, so a request the loaded server answers late
    still falls inside the other's hold when two slots allow it."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            p.wait(timeout=60)
            raise AssertionError(f"holder did not start: {line!r} {p.stderr.read()[-3000:]}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    spans = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        spans.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(spans)


def test_one_gpu_slot_means_stages_never_overlap(prefect_env):
    one = _hold_twice({**prefect_env, "THRESHER_GPU_LIMIT": "gpu-one", "THRESHER_GPU_SLOTS": "1"})
    (a_start, a_end), (b_start, b_end) = one
    assert b_start >= a_end, f"stages overlapped: {one}"
    # control: with two slots the same stages do run side by side
    two = _hold_twice({**prefect_env, "THRESHER_GPU_LIMIT": "gpu-two", "THRESHER_GPU_SLOTS": "2"})
    (a_start, a_end), (b_start, b_end) = two
    assert b_start < a_end, f"two slots should overlap: {two}"


def _curate_config(path: Path, model: Path, dataset: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"concurrent-{dataset}",
                "model": str(model),
                "batch_size": 8,
                "prompts": {"dataset": dataset, "split": "train", "limit": 24},
                "sampling": {"k": 3, "max_tokens": 16},
                "engine": {"dtype": "float32", "max_model_len": 256},
                "verify": {"verifiers": ["math"]},
                "select": {"cap": 2},
            }
        )
    )
    return path


def test_two_concurrent_curate_runs_share_a_lake(tiny_model, tmp_path, prefect_env):
    lake = Lake(tmp_path / "lake")
    for dataset, source in (("alpha", "train"), ("beta", "eval")):
        ingest_arithmetic(lake, dataset, source=source)
    procs = []
    for dataset in ("alpha", "beta"):
        cfg = _curate_config(tmp_path / f"{dataset}.yaml", tiny_model, dataset)
        cmd = [sys.executable, "-m", "thresher.flows.cli", "curate", "-c", str(cfg)]
        cmd += ["--lake", str(lake.root), "--no-progress"]
        procs.append(
            subprocess.Popen(
                cmd, env=prefect_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert "72 candidates" in out  # 24 prompts x k=3

    def sql(query: str) -> list[dict]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "thresher.flows.cli",
                "sql",
                query,
                "--lake",
                str(lake.root),
                "-f",
                "json",
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    per_dataset = sql(
        "SELECT p.dataset, count(*) AS n, count(DISTINCT c.candidate_id) AS ids "
        "FROM candidates c JOIN prompts p USING (prompt_id) GROUP BY 1 ORDER BY 1"
    )
    assert per_dataset == [
        {"dataset": "alpha", "n": 72, "ids": 72},
        {"dataset": "beta", "n": 72, "ids": 72},
    ]
    [total] = sql(
        "SELECT (SELECT count(*) FROM candidates) AS candidates, "
        "(SELECT count(*) FROM selections) AS selections, "
        "(SELECT count(DISTINCT candidate_id) FROM verdicts) AS verified, "
        "(SELECT count(*) FROM runs WHERE flow = 'curate' AND status = 'completed') AS runs"
    )
    assert total == {"candidates": 144, "selections": 144, "verified": 144, "runs": 2}


def test_runs_are_named_and_publish_their_funnel(tiny_model, tmp_path, prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate

    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake, "named")
    cfg = CurateConfig(
        name="named-run",
        model=str(tiny_model),
        prompts={"dataset": "named", "limit": 8},
        sampling={"k": 2, "max_tokens": 16},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["math"]},
    )
    with temporary_settings(updates={PREFECT_API_URL: prefect_server}):
        summary = run_curate(cfg, lake.root, progress=False)
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    name=FlowRunFilterName(any_=["curate named-run named round 0"])
                )
            )
            assert len(runs) == 1 and runs[0].state.is_completed()
            artifact = client.read_latest_artifacts()
            ours = [a for a in artifact if a.key == "curate-named-run-round-0"]
    assert ours, "no funnel artifact"
    body = ours[0].data
    assert "| prompts | candidates |" in body and f"| {summary['kept']} |" in body
