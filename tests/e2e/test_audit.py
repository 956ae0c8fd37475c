"""Audits end to end: a curated round (real engine), its audit sheet, labels computed from
the known answers imported through the CLI, verifier quality against a hand count, the
gate catching a verifier that passes everything, in `audit check` and in a bootstrap."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from thresher.config import BootstrapConfig, SelectConfig, VerifyConfig
from thresher.evaluators.audit import verifier_quality
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
PROMPTS = {"dataset": "arith", "split": "train", "limit": 40}
SAMPLING = {"k": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 16}
ENGINE = {"dtype": "float32", "max_model_len": 256}


def thresher(*args: str):
    """The CLI in this process (returncode, stdout, stderr, as a subprocess would give)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from thresher.flows.cli import app

    res = CliRunner().invoke(app, list(args))
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout, stderr=res.stderr)


def gated_config(tiny_model) -> dict:
    """A bootstrap verifying with a format verifier that requires nothing (it passes
    everything), gated on the labelled false-pass rate of each round."""
    return {
        "name": "broken",
        "base_model": str(tiny_model),
        "prompts": PROMPTS,
        "sampling": SAMPLING,
        "engine": ENGINE,
        "verify": {"verifiers": ["format"]},
        "train": {"method": "full", "max_steps": 2, "batch_size": 2},
        "eval": {
            "prompts": {"dataset": "arith", "split": "eval", "limit": 4},
            "n": 1,
            "ks": [1],
            "verify": {"verifiers": ["math"]},  # held-out truth: format has no reference
        },  # fmt: skip
        "audit": {"max_false_pass": 0.05, "min_labels": 10, "sheet_size": 30},
    }


def truly_correct(candidate: str, reference: str) -> bool:
    """The label a careful reader gives: the last number of the answer is the reference."""
    numbers = re.findall(r"-?\d+", candidate)
    return bool(numbers) and int(numbers[-1]) == int(reference)


@pytest.fixture(scope="module")
def audited(tiny_model, tmp_path_factory):
    """Round 0 curated twice over the same candidates: `good` verifies with math, `broken`
    with a format verifier that requires nothing (it passes everything). The good round's
    audit sheet is labelled from the known answers, three labels flipped on purpose."""
    from thresher.flows.curate import curate_flow
    from thresher.flows.evaluate import eval_flow
    from thresher.flows.runtime import flow_settings, stop_engine

    tmp = tmp_path_factory.mktemp("audit")
    lake = Lake(tmp / "lake")
    for split in ("train", "eval"):
        ingest(lake, EXAMPLES / f"{split}.jsonl", dataset="arith", split=split,
               mapping={"prompt": "question"}, task="arithmetic")  # fmt: skip
    gated = BootstrapConfig(**gated_config(tiny_model))
    model = str(tiny_model)
    broken = gated.curate_config(0, model)
    good = broken.model_copy(
        update={"name": "good", "verify": VerifyConfig(verifiers=["math"]),
                "select": SelectConfig(cap=2)}
    )  # fmt: skip
    # one engine for everything sampled here; the gated bootstrap then samples nothing
    with flow_settings():
        curate_flow(good.model_dump(), str(lake.root), False)
        again = dict(curate_flow(broken.model_dump(), str(lake.root), False))
        eval_flow(gated.eval_config(0, model).model_dump(), str(lake.root), False)
    stop_engine()
    res = thresher("audit", "--round", "0", "--name", "good", "--n", "60",
                   "--out", str(tmp / "sheets"), "--lake", str(lake.root))  # fmt: skip
    assert res.returncode == 0, res.stderr
    sheet_csv = tmp / "sheets" / "audit-good-round-0.csv"
    with sheet_csv.open() as f:
        rows = list(csv.DictReader(f))
    flipped = []
    for i, row in enumerate(rows):
        right = truly_correct(row["candidate"], row["reference"])
        if i % 20 == 7:  # a deliberate disagreement with the known answer
            right = not right
            flipped.append(row["candidate_id"])
        row["label"] = "correct" if right else "incorrect"
        row["note"] = "flipped" if row["candidate_id"] in flipped else ""
    labelled = tmp / "labelled.csv"
    with labelled.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return dict(lake=lake, tmp=tmp, res=res, rows=rows, labelled=labelled, flipped=flipped,
                again=again)  # fmt: skip


def test_the_sheet_covers_the_strata(audited):
    lake, rows, res = audited["lake"], audited["rows"], audited["res"]
    html = (audited["tmp"] / "sheets" / "audit-good-round-0.html").read_text()
    assert len(rows) == 60 and "wrote" in res.stdout
    assert len({r["candidate_id"] for r in rows}) == 60
    strata = {r["stratum"] for r in rows}
    assert {"math passed, kept", "math failed, dropped"} <= strata
    in_lake = lake.query(
        "SELECT candidate_id FROM current_selections WHERE pipeline = 'good' AND round = 0"
    )["candidate_id"].to_list()
    assert {r["candidate_id"] for r in rows} <= set(in_lake)
    for r in rows:  # each row shows its prompt, reference, candidate and verdicts
        assert (
            r["prompt"].startswith("What is") and r["reference"] and r["math"] in ("pass", "fail")
        )
        assert r["math_reason"] and r["candidate_id"] in html
    # every stratum's weight is its size over what was drawn from it
    sizes = dict(pl.DataFrame(rows).group_by("stratum").len().iter_rows())
    assert sum(float(r["weight"]) for r in rows) == pytest.approx(len(in_lake), rel=1e-3)
    assert all(sizes[r["stratum"]] * float(r["weight"]) >= sizes[r["stratum"]] for r in rows)
    # the second pipeline sampled nothing: same candidates, verified and selected anew
    assert audited["again"]["sampled_now"] == 0


def test_labels_import_once_and_rates_match_a_hand_count(audited):
    lake, rows, labelled = audited["lake"], audited["rows"], audited["labelled"]
    first = thresher("audit", "import", str(labelled), "--who", "ana", "--lake", str(lake.root))
    assert first.returncode == 0, first.stderr
    assert "60 labels imported, 0 already in the lake" in first.stdout
    second = thresher("audit", "import", str(labelled), "--who", "ana", "--lake", str(lake.root))
    assert "0 labels imported, 60 already in the lake" in second.stdout
    assert lake.count("labels") == 60
    assert set(lake.query("SELECT DISTINCT who FROM labels")["who"]) == {"ana"}
    notes = lake.query("SELECT candidate_id FROM labels WHERE note = 'flipped'")
    assert sorted(notes["candidate_id"]) == sorted(audited["flipped"])

    for verifier, column in (("math", "math"), ("rule", "rule")):
        hand = {"true_pass": 0, "false_pass": 0, "true_fail": 0, "false_fail": 0}
        for r in rows:
            passed, correct = r[column] == "pass", r["label"] == "correct"
            hand[f"{'true' if passed == correct else 'false'}_{'pass' if passed else 'fail'}"] += 1
        q = (
            verifier_quality(lake, "good", 0)
            .filter(pl.col("verifier") == verifier)
            .row(0, named=True)
        )
        assert {k: q[k] for k in hand} == hand and q["labelled"] == 60
        incorrect = hand["false_pass"] + hand["true_fail"]
        assert q["false_pass_rate"] == pytest.approx(hand["false_pass"] / incorrect, abs=1e-4)
        assert q["false_pass_rate_low"] <= q["false_pass_rate"] <= q["false_pass_rate_high"]
        correct = hand["true_pass"] + hand["false_fail"]
        assert q["recall"] == pytest.approx(hand["true_pass"] / correct, abs=1e-4)
    shown = thresher("audit", "quality", "--name", "good", "--lake", str(lake.root))
    assert shown.returncode == 0 and "false_pass_rate" in shown.stdout and "math" in shown.stdout


def test_bad_rows_go_to_rejects_and_a_non_sheet_is_refused(audited):
    lake, tmp = audited["lake"], audited["tmp"]
    cid = audited["rows"][0]["candidate_id"]
    bad = tmp / "bad.csv"
    bad.write_text(f"candidate_id,label\n{cid},maybe\nnot-a-candidate,correct\n{cid},\n")
    res = thresher("audit", "import", str(bad), "--lake", str(lake.root))
    assert res.returncode == 0 and "0 labels imported" in res.stdout and "2 rejected" in res.stdout
    reasons = lake.query("SELECT reason FROM rejects WHERE dataset = 'labels' ORDER BY line")
    assert reasons["reason"].to_list() == [
        "label 'maybe' is not correct or incorrect",
        "candidate_id 'not-a-candidate' is not in the lake",
    ]
    other = tmp / "other.csv"
    other.write_text("id,answer\n1,2\n")
    res = thresher("audit", "import", str(other), "--lake", str(lake.root))
    assert res.returncode == 2 and "needs candidate_id and label" in res.stderr
    assert "Traceback" not in res.stderr


def test_check_catches_the_verifier_that_passes_everything(audited):
    lake = audited["lake"]
    thresher("audit", "import", str(audited["labelled"]), "--lake", str(lake.root))
    broken = thresher("audit", "check", "--name", "broken", "--round", "0",
                      "--max-false-pass", "0.02", "--lake", str(lake.root))  # fmt: skip
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "rule: false-pass rate 1.000" in broken.stdout
    good = thresher("audit", "check", "--name", "good", "--max-false-pass", "0.2",
                    "--lake", str(lake.root))  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    few = thresher("audit", "check", "--name", "good", "--max-false-pass", "0.2",
                   "--min-labels", "500", "--lake", str(lake.root))  # fmt: skip
    assert few.returncode == 1 and "(< 500)" in few.stdout


def test_a_bootstrap_with_the_gate_stops_before_training(audited, tiny_model):
    lake, tmp = audited["lake"], audited["tmp"]
    thresher("audit", "import", str(audited["labelled"]), "--lake", str(lake.root))
    path = tmp / "gated.yaml"
    path.write_text(yaml.safe_dump(gated_config(tiny_model)))
    cmd = [sys.executable, "-m", "thresher.flows.cli", "bootstrap", "-c", str(path),
           "--lake", str(lake.root), "--no-progress"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "stopped at the audit gate before training" in res.stderr
    assert "rule: false-pass rate 1.000" in res.stderr and "Traceback" not in res.stderr
    assert lake.query("SELECT count(*) AS n FROM runs WHERE flow = 'train'")["n"][0] == 0
    assert "vLLM engine" not in res.stderr  # evaluated and curated already: nothing sampled
    assert (lake.root / "audits" / "audit-broken-round-0.html").exists()


def test_a_bootstrap_stops_at_the_monitors_gate_before_training(audited, tiny_model):
    """A threshold no round can meet (4 candidates a prompt, 5 distinct answers) stops the
    round with one line naming the monitor, its value and the threshold."""
    lake, tmp = audited["lake"], audited["tmp"]
    config = {**gated_config(tiny_model), "monitors": {"min_distinct_answers": 5}}
    del config["audit"]
    path = tmp / "monitored.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "thresher.flows.cli", "bootstrap", "-c", str(path),
           "--lake", str(lake.root), "--no-progress"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("error: "))
    distinct = lake.query("SELECT distinct_answers FROM round_monitors WHERE pipeline = 'broken'")
    assert (
        f"round 0 of broken stopped at the monitors gate before training: distinct_answers "
        f"{distinct[0, 0]:.4g} is below min_distinct_answers 5. " in line
    )
    assert "Traceback" not in res.stderr and "vLLM engine" not in res.stderr
    assert lake.query("SELECT count(*) AS n FROM runs WHERE flow = 'train'")["n"][0] == 0
