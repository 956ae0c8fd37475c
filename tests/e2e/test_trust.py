"""Data you can trust, end to end (real vLLM engine, packaged all-MiniLM-L6-v2, trainer,
Prefect): a reworded evaluation item is dropped with its evidence while same-template items
are kept; prompts whose samples agree on another answer than their reference are flagged,
kept out of training, labelled through the audit sheet and trained with the right answer in
the next round."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import yaml
from helpers import ARITHMETIC, full_training, thresher, write_jsonl

from thresher.answers import answer_key
from thresher.selection.decontam import numbers
from thresher.stores.lake import Lake

PROMPTS, K = 24, 8
WRONG = "-999"  # a reference no sample gives


def _config(tiny_model: Path, rounds: int) -> dict:
    return {
        "name": "trust",
        "base_model": str(tiny_model),
        "batch_size": 32,
        "max_rounds": rounds,
        "min_gain": -1.0,
        "patience": 5,
        "prompts": {"dataset": "arith", "split": "train"},
        # near-greedy: a prompt's samples agree, so agreement decides the flags
        "sampling": {"k": K, "temperature": 0.05, "top_p": 1.0, "max_tokens": 24},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"]},
        "select": {
            "cap": 8,
            "near_dup": False,
            # 24 prompts are too few to measure the tiny model's reliability: count it
            "suspects": {"min_model_agreement": 0.0, "min_model_prompts": 1},
            "decontaminate": {"exact": True, "semantic": {}},
        },
        "train": {
            **full_training(learning_rate=0.001, max_steps=2, batch_size=8, max_len=64),
            "all_rounds": False,
        },
        "eval": {"prompts": {"dataset": "arith", "split": "eval", "limit": 8}, "n": 1, "ks": [1]},
    }


def test_reworded_items_and_wrong_references_through_two_rounds(tiny_model, tmp_path: Path):
    lake = Lake(tmp_path / "lake")
    evals = [json.loads(line) for line in open(ARITHMETIC / "eval.jsonl")]
    train = [json.loads(line) for line in open(ARITHMETIC / "train.jsonl")][:PROMPTS]
    wrong = {r["question"] for r in train[:3]}
    for r in train[:3]:
        r["answer"] = WRONG
    source = evals[0]  # "What is a op b?", asked in other words
    expr = source["question"].removeprefix("What is ").rstrip("?")
    train.append({"question": f"Work out {expr} and give the result.", "answer": source["answer"]})
    for split, rows in (("train", train), ("eval", evals)):
        thresher("ingest", str(write_jsonl(tmp_path / f"{split}.jsonl", rows)), "--dataset",
                 "arith", "--split", split, "--map", "prompt=question", "--task", "arithmetic",
                 "--lake", str(lake.root))  # fmt: skip
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(_config(tiny_model, 1)))
    run = thresher("bootstrap", "-c", str(path), "--lake", str(lake.root), "--no-progress")
    assert run.returncode == 0, run.stderr[-4000:]

    ids = dict(lake.query("SELECT prompt, prompt_id FROM prompts").iter_rows())
    reworded = ids[train[-1]["question"]]
    # the reworded item is dropped with its evidence; so is any train item with an eval
    # item's numbers and answer (the same question), and no other
    pairs = lake.query("SELECT * FROM contamination").to_dicts()
    asked = {e["question"] for e in evals}

    def same_question(r: dict) -> bool:
        return r["question"] not in asked and any(
            numbers(r["question"]) == numbers(e["question"])
            and answer_key(r["answer"]) == answer_key(e["answer"])
            for e in evals
        )

    same = {ids[r["question"]] for r in train[:-1] if same_question(r)}
    assert {p["prompt_id"] for p in pairs} == {reworded} | same
    mine = next(p for p in pairs if p["prompt_id"] == reworded)
    assert mine["eval_prompt_id"] == ids[source["question"]]
    assert mine["agreed"] == f"numbers {' '.join(numbers(source['question']))}"
    reasons = lake.query(
        "SELECT prompt_id, drop_reason FROM current_selections WHERE round = 0"
    ).rows()
    # its candidates: failed, or passed and dropped for the eval item they reword
    mine_reasons = {r for p, r in reasons if p == reworded}
    assert mine_reasons <= {"failed", f"contaminated:reworded:{ids[source['question']]}"}
    assert not any(r and r.startswith("contaminated") for p, r in reasons if p not in
                   {reworded} | same)  # fmt: skip

    # the flags against a hand count of the samples' answers
    answers = lake.query(
        """SELECT c.prompt_id, p.answer AS reference, max(v.answer) AS answer
           FROM candidates c JOIN prompts p USING (prompt_id) JOIN verdicts v USING (candidate_id)
           WHERE c.round = 0 AND p.split = 'train' AND v.answer IS NOT NULL
           GROUP BY c.candidate_id, c.prompt_id, p.answer"""
    ).to_dicts()
    by_prompt: dict[str, list] = {}
    for a in answers:
        by_prompt.setdefault(a["prompt_id"], []).append(a)
    expected = {}
    for p, group in by_prompt.items():
        counts = Counter(answer_key(a["answer"]) for a in group)
        top, n = counts.most_common(1)[0]
        ref = answer_key(group[0]["reference"])
        if (len(group) >= 8 and top != ref and n / len(group) >= 0.6
                and counts.get(ref, 0) / len(group) <= 0.1):  # fmt: skip
            expected[p] = top
    flags = lake.query("SELECT * FROM suspect_references").to_dicts()
    assert {f["prompt_id"]: f["agreed_answer"] for f in flags} == expected
    injected = {ids[q] for q in wrong}
    assert injected <= set(expected), "every injected wrong reference is flagged"

    # on the audit sheet; labelled there: injected ones wrong (the right answer is what
    # the samples agree on), the rest right
    out = tmp_path / "audits"
    sheet = thresher("audit", "--round", "0", "--n", "20", "--out", str(out),
                     "--lake", str(lake.root))  # fmt: skip
    assert sheet.returncode == 0, sheet.stderr
    csv_path = next(out.glob("*.csv"))
    rows = list(csv.DictReader(open(csv_path)))
    assert {r["prompt_id"] for r in rows if r["agreed_answer"]} == set(expected)
    labelled, seen = [], set()
    for r in rows:
        if r["agreed_answer"] and r["prompt_id"] not in seen:
            seen.add(r["prompt_id"])
            bad = r["prompt_id"] in injected
            r.update(reference_label="wrong" if bad else "right",
                     right_answer=r["agreed_answer"] if bad else "", who="ana")  # fmt: skip
        labelled.append(r)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(labelled)
    imported = thresher("audit", "import", str(csv_path), "--lake", str(lake.root))
    assert imported.returncode == 0, imported.stderr
    assert f"{len(expected)} reference labels imported" in imported.stdout
    shown = thresher("audit", "flags", "references", "--format", "json", "--lake", str(lake.root))
    labels = {r["prompt_id"]: r["label"] for r in json.loads(shown.stdout)}
    assert labels == {p: "wrong" if p in injected else "right" for p in expected}
    assert set(lake.query("SELECT answer FROM prompts WHERE prompt_id IN (SELECT unnest(?))",
                          [list(injected)])["answer"]) == {WRONG}  # fmt: skip

    # round 1: the relabelled prompts are judged by their right answer, kept and trained on
    path.write_text(yaml.safe_dump(_config(tiny_model, 2)))
    run = thresher("bootstrap", "-c", str(path), "--lake", str(lake.root), "--no-progress")
    assert run.returncode == 0, run.stderr[-4000:]
    kept = lake.query(
        """SELECT s.prompt_id, s.kept, s.drop_reason FROM current_selections s
           WHERE s.round = 1"""
    ).to_dicts()
    for p in injected:  # the samples that agree now pass (one kept: they are one text)
        assert any(k["kept"] for k in kept if k["prompt_id"] == p), p
    assert not any((k["drop_reason"] or "").startswith("suspect") for k in kept)
    # the train run of model 2 (recorded at the round of the model it makes)
    rows_trained = lake.query(
        "SELECT json_extract(summary, '$.rows')::INT AS n FROM runs WHERE flow = 'train' "
        "AND round = 2"
    )["n"][0]
    assert rows_trained == sum(k["kept"] for k in kept)
