"""SIGKILL a curate run mid-way, run it again: exact counts, no duplicates, no re-sampling."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
K = 4


def curate_cmd(cfg_path, lake_root):
    return [
        sys.executable,
        "-m",
        "thresher.flows.cli",
        "curate",
        "-c",
        str(cfg_path),
        "--lake",
        str(lake_root),
        "--no-progress",
    ]


def part_files(lake_root):
    """The data files of the candidates table's latest version (committed batches only)."""
    return sorted(Path(f) for f in Lake(lake_root).tables.files("candidates")[1])


def test_kill_and_resume(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    n_prompts = ingest(
        lake,
        EXAMPLES / "train.jsonl",
        dataset="arith",
        mapping={"prompt": "question"},
        task="arithmetic",
    ).ingested
    cfg = {
        "name": "resume",
        "model": str(tiny_model),
        "batch_size": 8,
        "prompts": {"dataset": "arith"},
        "sampling": {"k": K, "max_tokens": 24},
        "engine": {"dtype": "float32", "max_model_len": 256},
    }
    cfg_path = tmp_path / "resume.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))

    # vLLM's default engine, a process of its own: a kill must take it down too
    default_engine = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    proc = subprocess.Popen(
        curate_cmd(cfg_path, lake.root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=default_engine,
    )
    deadline = time.monotonic() + 300
    while len(part_files(lake.root)) < 3 and proc.poll() is None:
        assert time.monotonic() < deadline, "curate never wrote a batch"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the engine and Prefect's server die with it
    proc.wait()

    before = {f.name: pq.read_table(f) for f in part_files(lake.root)}
    done = sum(t.num_rows for t in before.values())
    assert 0 < done < n_prompts * K, "the kill must land mid-run"
    done_batches = {b for t in before.values() for b in t.column("batch_id").to_pylist()}
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["running"]

    res = subprocess.run(
        curate_cmd(cfg_path, lake.root), capture_output=True, text=True, env=default_engine
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"({n_prompts * K - done} sampled now" in res.stdout

    counts = lake.query(
        "SELECT count(*) AS n, count(DISTINCT candidate_id) AS ids, "
        "count(DISTINCT prompt_id) AS prompts FROM candidates"
    ).row(0, named=True)
    assert counts == {"n": n_prompts * K, "ids": n_prompts * K, "prompts": n_prompts}
    per_prompt = lake.query("SELECT count(*) AS n FROM candidates GROUP BY prompt_id")
    assert set(per_prompt["n"]) == {K}

    # the finished batches' files are still in the table, untouched, and no later file
    # holds those batches again
    assert set(before) <= {f.name for f in part_files(lake.root)}
    for f in part_files(lake.root):
        if f.name in before:
            assert pq.read_table(f).equals(before[f.name])
        else:
            assert not done_batches & set(pq.read_table(f).column("batch_id").to_pylist())

    assert lake.count("verdicts") == n_prompts * K
    assert lake.count("selections") == n_prompts * K
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["completed"]
