"""`thresher train` with `distributed: {processes: 2}`: the flow starts torchrun, forwards
its log, writes rank 0's metrics to the lake and reports the result."""

import json
import subprocess
import sys

import yaml
from helpers import train_config

from thresher.stores.lake import Lake

STEPS = 6


def test_train_command_runs_two_processes(tiny_model, tmp_path, pairs_jsonl):
    from transformers import AutoModelForCausalLM

    ddp = {"processes": 2, "strategy": "ddp"}  # backend auto: gloo here
    cfg = train_config(tiny_model, pairs_jsonl, STEPS, lora_r=8, save_every=3, distributed=ddp)
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    lake = Lake(tmp_path / "lake")
    res = subprocess.run(
        [
            *(sys.executable, "-m", "thresher.flows.cli", "train", "-c", str(cfg_path)),
            *("--lake", str(lake.root), "--no-progress"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"trained {STEPS} steps on 6 examples" in res.stdout
    out = lake.root / "models" / "t" / "round-1"
    log = (out / "launch" / "train.log").read_text().strip()
    assert log and log.splitlines()[-1] in res.stderr  # torchrun's output came through
    metrics = lake.query("SELECT step, loss FROM train_metrics ORDER BY step")
    assert metrics["step"].to_list() == list(range(1, STEPS + 1))
    assert metrics["loss"][-1] < metrics["loss"][0]
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["completed"]
    lineage = json.loads((out / "thresher_train.json").read_text())
    assert lineage["distributed"] == {"processes": 2, "strategy": "ddp"}
    assert AutoModelForCausalLM.from_pretrained(out / "model") is not None
