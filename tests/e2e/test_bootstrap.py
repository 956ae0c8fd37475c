"""`thresher bootstrap` end to end (real vLLM engine, trainer, Prefect), and STaR
rationalization: hinted samples are flagged and train without their hint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml
from helpers import full_training, ingest_arithmetic, thresher

from thresher.evaluators.report import gain_by_task, task_pass_by_round
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"


def _lake(tmp_path: Path) -> Lake:
    lake = Lake(tmp_path / "lake")
    for split in ("train", "eval"):
        ingest_arithmetic(lake, split=split, source=split)
    return lake


def _thresher(*args: str) -> subprocess.CompletedProcess:
    return thresher(*args, "--no-progress")


def _count(lake: Lake, sql: str, params=None) -> int:
    return int(lake.query(sql, params)[0, 0])


CURATED = "SELECT run_id FROM runs WHERE flow = 'curate'"


def test_two_bootstrap_rounds_and_a_rerun_that_redoes_nothing(tiny_model, tmp_path):
    lake = _lake(tmp_path)
    config = {
        "name": "e2e",
        "base_model": str(tiny_model),
        "batch_size": 20,
        "max_rounds": 2,
        "min_gain": -1.0,  # never stop early: both rounds run
        "prompts": {"dataset": "arith", "split": "train", "limit": 40},
        "sampling": {"k": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 24},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"]},
        "select": {"cap": 2},
        "difficulty": {"skip_solved_above": 1.0, "hard_below": 0.5, "hard_k": 6},
        "rationalize": {"enabled": True, "k": 2, "max_share": 0.5},
        "train": full_training(
            learning_rate=0.001, max_steps=4, batch_size=8, max_len=64, save_every=2
        ),
        "eval": {
            "prompts": {"dataset": "arith", "split": "eval", "limit": 20},
            "n": 4,
            "ks": [1, 4],
        },
        "tracking": {},  # the default store: <lake>/mlflow.db
    }
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(config))
    first = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert first.returncode == 0, first.stderr[-4000:]
    assert "max_rounds (2) reached" in first.stdout

    # round 0: k unhinted candidates for each of the 40 prompts, one selection each
    per_round = lake.query(
        f"""SELECT round, count(*) FILTER (WHERE NOT hinted) AS plain,
                   count(*) FILTER (WHERE hinted) AS hinted
            FROM candidates WHERE run_id IN ({CURATED}) GROUP BY round ORDER BY round"""
    ).to_dicts()
    assert [r["round"] for r in per_round] == [0, 1]
    assert per_round[0]["plain"] == 40 * 4
    for r in (0, 1):
        curated = _count(
            lake, f"SELECT count(*) FROM candidates WHERE round = ? AND run_id IN ({CURATED})", [r]
        )
        assert _count(lake, "SELECT count(*) FROM selections WHERE round = ?", [r]) == curated

    # round 1 followed round 0's pass rates: solved prompts skipped, hard ones got 6
    rates = dict(
        lake.query("SELECT prompt_id, pass_rate FROM prompt_difficulty WHERE round = 0").rows()
    )
    got = dict(
        lake.query(
            f"""SELECT prompt_id, count(*) FROM candidates
                WHERE round = 1 AND NOT hinted AND run_id IN ({CURATED}) GROUP BY 1"""
        ).rows()
    )
    want = {p: (6 if rate < 0.5 else 4) for p, rate in rates.items() if rate < 1.0}
    assert got == want

    # hinted candidates only for prompts none of whose unhinted candidates passed
    hinted = lake.query(
        f"""SELECT round, prompt_id, count(*) AS n FROM candidates
            WHERE hinted AND run_id IN ({CURATED}) GROUP BY ALL"""
    ).to_dicts()
    unsolved = lake.query(
        "SELECT round, prompt_id FROM prompt_difficulty WHERE kind = 'all_fail'"
    ).rows()
    assert {(h["round"], h["prompt_id"]) for h in hinted} == set(unsolved)
    assert all(h["n"] == 2 for h in hinted)

    # one model per round, evaluated with every k, base model as round 0
    for r in (1, 2):
        assert (lake.root / "models" / "e2e" / f"round-{r}" / "model" / "config.json").exists()
    evals = lake.query(
        "SELECT round, metric FROM evals WHERE task = 'all' AND split = 'eval' ORDER BY 1, 2"
    ).rows()
    metrics = ("constant-answer", "pass@1", "pass@1 non-modal", "pass@4")
    assert evals == [(r, m) for r in (0, 1, 2) for m in metrics]
    _check_tracking(lake, f"sqlite:///{lake.root.resolve() / 'mlflow.db'}")
    assert _count(lake, "SELECT count(DISTINCT run_id) FROM train_metrics") == 2
    assert "round r's pass@k is model r" in first.stdout

    # every round records its monitors: the summary's rounds carry what round_monitors
    # holds (headroom from model r's evaluation, largest k), and the report shows them
    from thresher.evaluators.page import write_report

    ran = json.loads(lake.query("SELECT summary FROM runs WHERE flow = 'bootstrap'")[0, 0])
    monitors = "SELECT * EXCLUDE (pipeline) FROM round_monitors WHERE pipeline = 'e2e'"
    view = {row.pop("round"): row for row in lake.query(monitors).to_dicts()}
    assert sorted(view) == [0, 1]
    for entry in ran["rounds"]:
        assert entry["monitors"] == view[entry["round"]]
        assert entry["monitors"]["headroom_metric"] == "pass@4"
        assert 1 <= entry["monitors"]["distinct_answers"] <= 6
    page = write_report(lake, tmp_path / "report", name="e2e").read_text()
    assert "<h2>Monitors</h2>" in page and (tmp_path / "report" / "monitors.png").exists()

    # per-task pass@1 with intervals, from the evaluations' own candidates and verdicts:
    # the overall figure is the one the evaluation recorded, and round 2's gain over the
    # base model is the difference of the two on the same prompts
    recorded = dict(
        lake.query(
            "SELECT round, value FROM evals WHERE task = 'all' AND split = 'eval' "
            "AND metric = 'pass@1'"
        ).rows()
    )
    overall = task_pass_by_round(lake, "e2e").filter(pl.col("task") == "all")
    assert overall["round"].to_list() == [0, 1, 2]
    for row in overall.iter_rows(named=True):
        assert row["pass_at_1"] == pytest.approx(recorded[row["round"]])
        assert row["low"] <= row["pass_at_1"] <= row["high"] and row["prompts"] == 20
    gain = gain_by_task(lake, "e2e").row(0, named=True)
    assert (gain["task"], gain["round"], gain["prompts"]) == ("all", 2, 20)
    assert gain["gain"] == pytest.approx(recorded[2] - recorded[0])
    assert gain["low"] <= gain["gain"] <= gain["high"]
    assert "<h2>Per task</h2>" in page and 'alt="Held-out pass@1 per task"' in page
    assert (tmp_path / "report" / "tasks.png").read_bytes()[:4] == b"\x89PNG"

    # re-running the same command samples, trains and evaluates nothing new
    before = {
        t: lake.count(t) for t in ("candidates", "verdicts", "selections", "train_metrics", "evals")
    }
    again = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert again.returncode == 0, again.stderr[-4000:]
    assert {t: lake.count(t) for t in before} == before
    assert again.stderr.count("already trained") == 2
    assert "starting the vLLM engine" not in again.stderr

    # `verify:` edited after the rounds ran: the next run continues, verifies the same
    # candidates with the added verifier, and measures every model with it
    config["verify"] = {"verifiers": ["math", "exact"]}
    path.write_text(yaml.safe_dump(config))
    edited = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert edited.returncode == 0, edited.stderr[-4000:]
    assert "max_rounds (2) reached" in edited.stdout
    curated = f"SELECT candidate_id FROM candidates WHERE round = 0 AND run_id IN ({CURATED})"
    assert _count(
        lake,
        f"SELECT count(*) FROM verdicts WHERE verifier = 'exact' AND candidate_id IN ({curated})",
    ) == _count(lake, f"SELECT count(*) FROM ({curated})")
    per_round = lake.query(
        "SELECT round, count(DISTINCT run_id) AS runs FROM evals WHERE task = 'all' "
        "GROUP BY 1 ORDER BY 1"
    ).rows()
    assert per_round == [(0, 2), (1, 2), (2, 2)]  # each model measured with both configs

    # held-out metrics have verifiers of their own: with eval.verify [exact], training keeps
    # math and exact, but every round's metric (and so the stop rule) is exact's alone
    config["eval"]["verify"] = {"verifiers": ["exact"]}
    path.write_text(yaml.safe_dump(config))
    own = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert own.returncode == 0, own.stderr[-4000:]
    assert "starting the vLLM engine" not in own.stderr  # nothing sampled: verdicts exist
    summary = lake.query(
        "SELECT summary FROM runs WHERE flow = 'bootstrap' ORDER BY started_at DESC LIMIT 1"
    )["summary"][0]
    summary = json.loads(summary)
    assert summary["eval_verify"]["verifiers"] == ["exact"]
    newest = lake.query(
        """SELECT e.round, e.value, e.model FROM evals e JOIN runs r USING (run_id)
           WHERE e.task = 'all' AND e.metric = 'pass@1'
             AND json_extract_string(r.config, '$.verify.verifiers') = '["exact"]'
           ORDER BY e.round"""
    ).to_dicts()
    assert [e["round"] for e in newest] == [0, 1, 2]
    for e in newest:
        by_hand = lake.query(
            """SELECT avg(v.passed::INT) AS p FROM candidates c
               JOIN prompts p USING (prompt_id)
               JOIN verdicts v ON v.candidate_id = c.candidate_id AND v.verifier = 'exact'
               WHERE p.split = 'eval' AND c.round = ? AND c.model = ?""",
            [e["round"], e["model"]],
        )["p"][0]
        assert abs(e["value"] - by_hand) < 1e-9
    stopped_on = {h["round"]: h for h in summary["evals"]}
    for e in newest:
        pass1 = [m for m in stopped_on[e["round"]]["metrics"] if m["task"] == "all"]
        assert any(abs(m["value"] - e["value"]) < 1e-9 for m in pass1 if m["metric"] == "pass@1")

    # an evaluation that would rest only on verifiers without a reference is refused
    config["eval"]["verify"] = {"verifiers": ["majority"]}
    path.write_text(yaml.safe_dump(config))
    refused = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert refused.returncode == 2
    assert "judge without a reference" in refused.stderr + refused.stdout


def test_rationalized_samples_are_flagged_and_train_without_the_hint(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from thresher.stores.export import sft_rows
    from thresher.trainers.data import encode

    lake = _lake(tmp_path)
    hint = "{prompt} (Hint: the answer is {answer}.)"
    config = {
        "name": "rationalize",
        "model": str(tiny_model),
        "prompts": {"dataset": "arith", "split": "train", "limit": 40},
        "sampling": {"k": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 24},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"]},
        "select": {"cap": 8, "near_dup": False, "decontaminate": {"enabled": False}},
        "rationalize": {"enabled": True, "k": 8, "hint": hint, "max_share": None},
    }
    path = tmp_path / "curate.yaml"
    path.write_text(yaml.safe_dump(config))
    done = _thresher("curate", "-c", str(path), "--lake", str(lake.root))
    assert done.returncode == 0, done.stderr[-4000:]

    outcomes = lake.query(
        """SELECT c.prompt_id, c.hinted, s.drop_reason IS DISTINCT FROM 'failed' AS passed
           FROM candidates c JOIN selections s USING (candidate_id)"""
    ).to_dicts()
    failed_plain = {o["prompt_id"] for o in outcomes if not o["hinted"] and not o["passed"]}
    hinted = [o for o in outcomes if o["hinted"]]
    assert failed_plain, "every prompt passed at k=1: nothing to rationalize"
    assert {o["prompt_id"] for o in hinted} == failed_plain
    assert len(hinted) == 8 * len(failed_plain)

    rows = [r for r in sft_rows(lake, 0) if r["hinted"]]
    assert rows, "no hinted candidate passed"
    prompts = dict(lake.query("SELECT prompt_id, prompt FROM prompts").rows())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for row in rows:
        question = row["messages"][0]["content"]
        assert question == prompts[row["prompt_id"]] and "Hint" not in question
        prompt_ids, _ = encode(row, tokenizer)
        trained_prompt = tokenizer.decode(prompt_ids)
        assert question in trained_prompt and "Hint" not in trained_prompt


def test_a_planted_bad_round_rolls_back_to_the_best_model(tiny_model, tmp_path):
    """Round 0 trains on wrong answers (rule `not math` keeps the answers math fails, mixed
    with a file of wrong sums): model 1 regresses on the held-out truth (math), so round 1
    samples with model 0, and model 0 stays the best."""
    lake = _lake(tmp_path)
    wrong = tmp_path / "wrong-sums.jsonl"  # every sum of the data set, one off
    with wrong.open("w") as out:
        for split in ("train", "eval"):
            for line in (EXAMPLES / f"{split}.jsonl").read_text().splitlines():
                row = json.loads(line)
                a, op, b = row["question"].removeprefix("What is ").removesuffix("?").split()
                bad = int(row["answer"]) + 1
                answer = f" {a} {op} {b} = {bad}. The answer is {bad}."
                out.write(json.dumps({"prompt": row["question"], "response": answer}) + "\n")
    config = {
        "name": "planted",
        "base_model": str(tiny_model),
        "batch_size": 24,
        "max_rounds": 2,
        "min_gain": -1.0,
        "prompts": {"dataset": "arith", "split": "train", "limit": 24},
        "sampling": {"k": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 16},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"], "rule": "not math"},  # wrong answers only
        "select": {"cap": 4, "near_dup": False},
        "train": full_training(
            learning_rate=0.01,
            max_steps=40,
            batch_size=8,
            max_len=64,
            save_every=100,
            mix=[{"pipeline": "self", "weight": 1}, {"path": str(wrong), "weight": 3}],
        ),
        "eval": {
            "prompts": {"dataset": "arith", "split": "eval", "limit": 24},
            "n": 4,
            "ks": [1],
            "verify": {"verifiers": ["math"]},
        },
        "rollback": {"tolerance": 0.02},
    }
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump(config))
    done = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(
        lake.query("SELECT summary FROM runs WHERE flow = 'bootstrap' AND status = 'completed'")[
            "summary"
        ][0]
    )
    pass1 = [
        next(m["value"] for m in h["metrics"] if m["task"] == "all" and m["metric"] == "pass@1")
        for h in summary["evals"]
    ]
    assert pass1[1] < pass1[0] - 0.02, pass1  # the planted round regressed
    assert [r["sampled_with"] for r in summary["rounds"]] == [0, 0]
    assert "regressed" in done.stderr and "sampling with model 0" in done.stderr
    # round 1's candidates came from model 0 (the base model), not from model 1
    models = lake.query(
        f"SELECT DISTINCT model FROM candidates WHERE round = 1 AND run_id IN ({CURATED})"
    )["model"].to_list()
    assert models == [str(tiny_model)]
    best = 0 if pass1[0] >= pass1[2] else 2
    assert summary["best_round"] == best
    pointer = json.loads((lake.root / "models" / "planted" / "best.json").read_text())
    assert pointer["round"] == best
    report = thresher("report", "--name", "planted", "--lake", str(lake.root))
    assert report.returncode == 0, report.stderr[-3000:]
    page = (lake.root / "report" / "index.html").read_text()
    assert "Round 1 sampled with model 0" in page and f"round {best}</b>" in page
    # The same run with a forgetting check on a held-out set of its own: model 1 (trained
    # on wrong answers) loses pass@1 there against the base model, so the run stops at
    # round 1 with one line and the figures; finished steps are reused, not redone.
    ingest_arithmetic(lake, "general", split="eval", source="eval")
    trained_before = _count(lake, "SELECT count(*) FROM runs WHERE flow = 'train'")
    config["eval"]["also"] = [{"dataset": "general", "limit": 24, "max_drop": 0.0}]
    path.write_text(yaml.safe_dump(config))
    gated = _thresher("bootstrap", "-c", str(path), "--lake", str(lake.root))
    assert gated.returncode != 0, gated.stdout[-2000:]
    line = next(x for x in gated.stderr.splitlines() if "stopped at the forgetting check" in x)
    assert "model 1 scores pass@1" in line and "general/eval" in line and "max_drop 0.0" in line
    assert _count(lake, "SELECT count(*) FROM runs WHERE flow = 'train'") == trained_before
    stopped = lake.query(
        "SELECT status, summary FROM runs WHERE flow = 'bootstrap' ORDER BY updated_at DESC"
    ).row(0, named=True)
    assert stopped["status"] == "failed"
    also = [h.get("also") for h in json.loads(stopped["summary"])["evals"]]
    assert also[1][0]["check"] == "general/eval" and also[1][0]["drop"] > 0
    assert also[1][0]["base_pass@1"] == also[0][0]["pass@1"]
    # the forgetting evaluations are their own runs, out of the rounds' own metric
    forgetting = lake.query(
        "SELECT DISTINCT e.round FROM evals e JOIN runs r USING (run_id) "
        "WHERE json_extract_string(r.config, '$.name') = 'planted~general/eval' ORDER BY 1"
    )["round"].to_list()
    assert forgetting == [0, 1]


def _check_tracking(lake: Lake, uri: str) -> None:
    """MLflow's own client reads back what the run logged: one run per curate, train,
    evaluate and bootstrap run, and the bootstrap's pass@1 per round equal to `evals`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("e2e")
    runs = client.search_runs([experiment.experiment_id])
    flows = sorted(r.data.tags["thresher.flow"] for r in runs)
    assert flows == ["bootstrap", "curate", "curate", "evaluate", "evaluate", "evaluate",
                     "train", "train"]  # fmt: skip
    assert all(r.info.status == "FINISHED" for r in runs)
    (boot,) = [r for r in runs if r.data.tags["thresher.flow"] == "bootstrap"]
    history = client.get_metric_history(boot.info.run_id, "pass_at_1")
    logged = {m.step: m.value for m in history}
    want = dict(
        lake.query(
            "SELECT round, value FROM evals WHERE task = 'all' AND metric = 'pass@1' "
            "AND split = 'eval'"
        ).rows()
    )
    assert logged == pytest.approx(want) and sorted(logged) == [0, 1, 2]
    kept = {m.step: m.value for m in client.get_metric_history(boot.info.run_id, "curate/kept")}
    funnel = dict(lake.query("SELECT round, kept FROM round_funnel").rows())
    assert kept == {r: float(n) for r, n in funnel.items()}
    assert (
        boot.data.params["base_model"]
        == lake.query("SELECT model FROM runs WHERE flow = 'bootstrap'")[0, 0]
    )
    plots = {a.path for a in client.list_artifacts(boot.info.run_id, "report")}
    assert "report/passk.png" in plots and "report/index.html" in plots
    (train,) = [r for r in runs if r.data.tags["thresher.flow"] == "train"][:1]
    losses = client.get_metric_history(train.info.run_id, "train/loss")
    assert losses and all(m.value > 0 for m in losses)
