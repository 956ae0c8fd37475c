"""SIGKILL a curate run mid-way, run it again: exact counts, no duplicates, no re-sampling."""

import os
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from helpers import curate_cmd, ingest_arithmetic, kill_mid_run, resume_run

from thresher.stores.lake import Lake

K = 4


def part_files(lake_root):
    """The data files of the candidates table's latest version (committed batches only)."""
    return sorted(Path(f) for f in Lake(lake_root).tables.files("candidates")[1])


def test_kill_and_resume(tiny_model, tmp_path):
    lake = Lake(tmp_path / "lake")
    n_prompts = ingest_arithmetic(lake).ingested
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
    cmd = curate_cmd(cfg_path, lake.root)
    kill_mid_run(cmd, lambda: len(part_files(lake.root)), 3, env=default_engine)

    before = {f.name: pq.read_table(f) for f in part_files(lake.root)}
    done = sum(t.num_rows for t in before.values())
    assert 0 < done < n_prompts * K, "the kill must land mid-run"
    done_batches = {b for t in before.values() for b in t.column("batch_id").to_pylist()}
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["running"]

    resume_run(cmd, n_prompts * K - done, env=default_engine)

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
