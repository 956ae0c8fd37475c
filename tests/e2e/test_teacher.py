"""A teacher and hints in a bootstrap round, end to end (real vLLM engine, trainer,
Prefect): the teacher samples only what the student left unsolved, its candidates are
verified, stored with their source, capped and trained on; hinted samples carry the part of
a verified solution they were given."""

from __future__ import annotations

from pathlib import Path

import yaml
from helpers import full_training, ingest_arithmetic, thresher

from thresher.hints import copied_share
from thresher.stores.lake import Lake

PROMPTS, K, TEACHER_K, BUDGET = 40, 2, 2, 40


def test_a_teacher_and_solution_hints_in_a_round(tiny_model, tmp_path: Path):
    lake = Lake(tmp_path / "lake")
    for split in ("train", "eval"):
        ingest_arithmetic(lake, split=split, source=split)
    config = {
        "name": "taught",
        "base_model": str(tiny_model),
        "batch_size": 20,  # two batches: the budget holds across them
        "max_rounds": 1,
        "min_gain": -1.0,
        "prompts": {"dataset": "arith", "split": "train", "limit": PROMPTS},
        # a student that guesses (hot) and a teacher that does not (the same weights, cold)
        "sampling": {"k": K, "temperature": 1.6, "top_p": 1.0, "max_tokens": 24},
        "engine": {"dtype": "float32", "max_model_len": 256},
        "verify": {"verifiers": ["math"]},
        "select": {"cap": 2, "teacher_cap": 1, "max_teacher_share": 0.5},
        "teachers": [
            {
                "name": "cold",
                "model": str(tiny_model),
                "k": TEACHER_K,
                "budget": BUDGET,
                "sampling": {"temperature": 0.1},
            }
        ],
        "hints": {"share": 0.5, "k": 2},
        "train": full_training(learning_rate=0.001, max_steps=2, batch_size=8, max_len=64),
        "eval": {"prompts": {"dataset": "arith", "split": "eval", "limit": 10}, "n": 2, "ks": [1]},
    }
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(config))
    run = thresher("bootstrap", "-c", str(path), "--lake", str(lake.root), "--no-progress")
    assert run.returncode == 0, run.stderr[-4000:]

    cands = lake.query(
        """SELECT c.candidate_id, c.prompt_id, c.source, c.hint, c.text, c.model, s.kept,
                  s.drop_reason, (SELECT bool_and(v.passed) FROM verdicts v
                                  WHERE v.candidate_id = c.candidate_id) AS passed
           FROM current_selections s JOIN candidates c USING (candidate_id)"""
    ).to_dicts()
    own = [c for c in cands if c["source"] == "student"]
    taught = [c for c in cands if c["source"] == "teacher:cold"]
    assert len(own) == PROMPTS * K
    unsolved = {p for p in {c["prompt_id"] for c in own}} - {
        c["prompt_id"] for c in own if c["passed"]
    }
    # the teacher sampled only unsolved prompts, k each, within its budget over both batches
    assert taught and {c["prompt_id"] for c in taught} <= unsolved
    assert len(taught) == min(BUDGET, TEACHER_K * len(unsolved))
    assert all(c["passed"] is not None for c in taught)  # every one verified
    assert all(c["model"] == str(tiny_model) for c in taught)
    # capped: at most one teacher candidate kept a prompt, no more than half of what is kept
    kept_taught = [c for c in taught if c["kept"]]
    assert kept_taught, "the cold teacher solves some of what the hot student did not"
    per_prompt = {}
    for c in kept_taught:
        per_prompt[c["prompt_id"]] = per_prompt.get(c["prompt_id"], 0) + 1
    assert max(per_prompt.values()) == 1
    passing_taught = [c for c in taught if c["passed"]]
    kept = [c for c in cands if c["kept"]]
    assert len(kept_taught) <= len(kept) / 2
    # hinted samples: prompts left unsolved that had a verified solution, each given its
    # first half up to the answer; none kept that only restates the hint
    hinted = [c for c in cands if c["source"] == "hint:solution"]
    assert hinted
    solved_by_teacher = {c["prompt_id"] for c in passing_taught}
    assert {c["prompt_id"] for c in hinted} <= solved_by_teacher
    for c in hinted:
        assert c["hint"] and any(
            t["text"].split()[: len(c["hint"].split())] == c["hint"].split()
            for t in passing_taught
            if t["prompt_id"] == c["prompt_id"]
        )
        if c["kept"]:
            assert copied_share(c["text"], c["hint"]) <= 0.8
    # trained on: model 1's training rows are the kept candidates, the teacher's included
    rows = lake.query(
        "SELECT json_extract(summary, '$.rows')::INT AS n FROM runs WHERE flow = 'train'"
    )["n"][0]
    assert rows == len(kept)
    # the run's summary counts kept examples and tokens per source
    summary = lake.query(
        "SELECT summary FROM runs WHERE flow = 'curate' ORDER BY updated_at DESC LIMIT 1"
    )["summary"][0]
    assert f'"teacher:cold": {{"candidates": {len(taught)}' in summary.replace("\n", "")
    assert "kept by source" in run.stderr + run.stdout
    classes = lake.query("SELECT class, count(*) AS n FROM prompt_classes GROUP BY 1").rows()
    teachable = {c["prompt_id"] for c in passing_taught}
    assert dict(classes).get("teachable", 0) == len(teachable)
