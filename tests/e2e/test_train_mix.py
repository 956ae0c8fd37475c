"""`thresher train` on a mix (train.mix) of a pipeline's kept data, a prompts dataset with
reference answers and an SFT file: shares met within 1 % of the rows trained on, recorded
with the run (`thresher sql "SELECT * FROM train_mix"`); the same config again trains
nothing, a changed weight trains again."""

import json
import subprocess
import sys

import yaml
from helpers import kept_pipeline

from thresher.config import TrainConfig
from thresher.identities import rows_digest
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake
from thresher.trainers.mix import mixed_rows

WEIGHTS = {"pipeline:self": 7, "dataset:refs": 3}  # and the SFT file: 4


def thresher(*args, env):
    cmd = [sys.executable, "-m", "thresher.flows.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def test_a_mix_trains_on_its_shares_and_a_new_weight_retrains(tiny_model, tmp_path, prefect_env):
    lake = Lake(tmp_path / "lake")
    kept_pipeline(lake, "other", rounds=2, per_round=40)  # self: 80 kept rows
    refs = tmp_path / "refs.jsonl"
    refs.write_text(
        "".join(
            json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1), "task": "math"}) + "\n"
            for i in range(60)
        )
    )
    ingest(lake, refs, "refs")
    general = tmp_path / "general.jsonl"
    general.write_text(
        "".join(json.dumps({"prompt": f"Echo {i}.", "response": f"{i}"}) + "\n" for i in range(25))
        + "{broken\n"
    )
    mix = [
        {"pipeline": "self", "weight": 7},
        {"dataset": "refs", "weight": 3},
        {"path": str(general), "weight": 4},
    ]
    cfg = {
        "name": "mixed",
        "base_model": str(tiny_model),
        "data": {"pipeline": "other", "round": 1, "all_rounds": True},
        "mix": mix,
        "max_steps": 3,
        "batch_size": 8,
        "max_len": 64,
        "lora": {"r": 8, "alpha": 16},
        "eval_fraction": 0.0,
        "save_every": 100,
        "log_every": 1,
    }
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    train = ["train", "-c", str(cfg_path), "--lake", str(lake.root), "--no-progress"]

    first = thresher(*train, env=prefect_env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "mix pipeline:self: 80 rows" in first.stdout

    # the recorded mix, through the CLI
    res = thresher("sql", "SELECT * FROM train_mix", "-f", "json", "--lake", str(lake.root),
                   env=prefect_env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    view = json.loads(res.stdout)
    assert [v["source"] for v in view] == ["pipeline:self", "dataset:refs", f"path:{general}"]
    assert [v["rows"] for v in view] == [80, 34, 46]  # 80 / (7/14) = 160 rows
    assert [v["available"] for v in view] == [80, 60, 25]
    assert view[2]["repeated"] == 21 and {v["pipeline"] for v in view} == {"mixed"}

    # a hand count of the rows it trained on (the digest proves these are those rows)
    [run] = lake.query("SELECT summary FROM runs WHERE flow = 'train'")["summary"].to_list()
    summary = json.loads(run)
    ingested = {str(general): ingest(lake, general, "general", preset="sft").prompt_ids}
    rows, _ = mixed_rows(TrainConfig(**cfg), lake, ingested)
    assert rows_digest(rows) == summary["rows_digest"] and summary["rows"] == len(rows) == 160
    weights = {**WEIGHTS, f"path:{general}": 4}
    for source, weight in weights.items():
        count = sum(r["mix_source"] == source for r in rows)
        assert abs(count / len(rows) - weight / sum(weights.values())) <= 0.01, source
    assert lake.query("SELECT count(*) AS n FROM rejects")["n"][0] == 1  # the broken line, once

    again = thresher(*train, env=prefect_env)
    assert again.returncode == 0, again.stderr[-3000:]
    runs_before = runs = lake.query(
        "SELECT run_id, status FROM runs WHERE flow = 'train'"
    ).to_dicts()
    assert len(runs) == 1 and runs[0]["status"] == "completed"  # nothing trained again
    assert lake.query("SELECT count(*) AS n FROM train_metrics")["n"][0] == 3

    mix[1]["weight"] = 2
    cfg_path.write_text(yaml.safe_dump(cfg))
    changed = thresher(*train, env=prefect_env)
    assert changed.returncode == 0, changed.stderr[-3000:]
    runs = lake.query("SELECT run_id, status FROM runs WHERE flow = 'train'").to_dicts()
    assert len(runs) == 2 and {r["status"] for r in runs} == {"completed"}
    assert lake.query("SELECT count(*) AS n FROM train_metrics")["n"][0] == 6
    new = [r["run_id"] for r in runs if r["run_id"] != runs_before[0]["run_id"]]
    shown = lake.query("SELECT rows FROM train_mix WHERE run_id = $r", {"r": new[0]})
    assert shown["rows"].to_list() == [80, 23, 45]  # 80 / (7/13) = 148 rows
    assert lake.query("SELECT count(*) AS n FROM rejects")["n"][0] == 1
