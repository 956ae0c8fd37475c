"""`thresher train` end to end: killed after a checkpoint, resumed, merged model in vLLM."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import train_config

from thresher.stores.lake import Lake

STEPS = 240


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory, pairs_jsonl):
    tmp = tmp_path_factory.mktemp("train")
    cfg = train_config(tiny_model, pairs_jsonl, STEPS, lora_r=16, save_every=10, keep_checkpoints=2)
    cfg_path = tmp / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    lake = Lake(tmp / "lake")
    cmd = [
        sys.executable,
        "-m",
        "thresher.flows.cli",
        "train",
        "-c",
        str(cfg_path),
        "--lake",
        str(lake.root),
        "--no-progress",
    ]
    out = lake.root / "models" / "t" / "round-1"

    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / "step-10" / "state.json").exists():
        assert proc.poll() is None, "train exited before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))
    res = subprocess.run(cmd, capture_output=True, text=True)
    return lake, out, killed_at, res


def test_killed_run_resumes_to_the_same_number_of_steps(trained):
    lake, out, killed_at, res = trained
    assert res.returncode == 0, res.stderr[-3000:]
    assert killed_at < STEPS, "the kill must land before the end"
    result = json.loads((out / "thresher_train.json").read_text())["result"]
    assert result["steps"] == STEPS and result["resumed_from"] >= 10
    assert f"resumed from step {result['resumed_from']}" in res.stdout
    steps = lake.query("SELECT step, count(*) AS n FROM train_metrics GROUP BY 1 ORDER BY 1")
    assert steps["step"].to_list() == list(range(1, STEPS + 1))
    assert set(steps["n"]) == {1}
    assert len(list((out / "checkpoints").glob("step-*"))) == 2  # keep_checkpoints
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["completed"]


def test_merged_model_loads_in_vllm_and_answers(trained, made_up_pairs):
    from thresher.samplers.vllm_offline import get_engine, render_prompts, sample, shutdown_engine

    _, out, _, res = trained
    assert res.returncode == 0
    llm = get_engine(str(out / "model"), dtype="float32", max_model_len=256)
    try:
        messages = [json.dumps([{"role": "user", "content": q}]) for q, _ in made_up_pairs]
        prompts = render_prompts(llm, [None] * len(made_up_pairs), messages)
        outs = sample(llm, prompts, k=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=8)
    finally:
        shutdown_engine()
    assert [o[0].text.strip() for o in outs] == [a for _, a in made_up_pairs]
