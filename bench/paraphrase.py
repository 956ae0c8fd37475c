"""Reworded evaluation items: precision and recall of each decontamination check.

The evaluation set is the bundled word problems' eval split (200) and reasoning-gym
questions (basic_arithmetic, chain_sum, gcd, letter_counting: 50 each). Positives: each
item rewritten by templates used nowhere else in thresher (another name, the question
first, other words; reasoning-gym's questions asked in other words around the same
expression, numbers or quoted text). Negatives: distinct items of the same templates
(the word problems' train split, reasoning-gym with another seed) whose numbers and
quoted text differ from every evaluation item's, half of them rewritten the same way.

A positive counts as found when the check names its own source item; any match of a
negative, or of a positive to another item, is a false match. Precision: found /
matches; recall: found / positives. Prints one row per check.

    python bench/paraphrase.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ROOT / "examples" / "word-problems"
NAMES = ["Priya", "Tomasz", "Ngozi", "Mateo", "Sven", "Yuki", "Amara", "Farid"]
SWAPS = [("has", "owns"), ("had", "owned"), ("gives", "hands"), ("in all", "altogether"),
         ("left", "remaining"), ("finds", "picks up"), ("buys", "purchases"),
         ("boxes", "crates"), ("box", "crate"), ("lost", "misplaced")]  # fmt: skip
TASKS = ["basic_arithmetic", "chain_sum", "gcd", "letter_counting"]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s.strip()]


def reword_problem(text: str, kind: int, rng: random.Random) -> str:
    """A word problem reworded: another name and other words (kind 0), or also the question
    first inside a frame (kind 1)."""
    name = text.split()[0]
    new = rng.choice([n for n in NAMES if n != name])
    out = re.sub(rf"\b{re.escape(name)}\b", new, text)
    for a, b in SWAPS:
        out = re.sub(rf"\b{a}\b", b, out)
    if kind == 1:
        parts = _sentences(out)
        out = f"Here is a question: {parts[-1]} We know that {' '.join(parts[:-1])}"
    return out


def reword_rg(task: str, question: str, kind: int) -> str:
    """A reasoning-gym question asked in other words around its own expression, numbers or
    quoted text."""
    if task == "basic_arithmetic":
        expr = re.match(r"Calculate (.*)\.$", question).group(1)
        return [f"What is the value of {expr}? Work it out.",
                f"Evaluate the expression {expr} and report the result."][kind]  # fmt: skip
    if task == "chain_sum":
        expr = question.split(":", 1)[1].rstrip("= ").strip()
        return [f"Work out {expr} and give the result.",
                f"What number does {expr} come to?"][kind]  # fmt: skip
    if task == "gcd":
        nums = re.search(r"numbers: ([\d, ]+)\.", question).group(1)
        return [f"What is the largest whole number that divides each of {nums} exactly?",
                f"Give the greatest common factor of {nums}, as one number."][kind]  # fmt: skip
    letter, text = re.findall(r'"([^"]*)"', question)[:2]
    return [f"Count how often the letter '{letter}' occurs in '{text}'.",
            f'In the phrase "{text}", how many "{letter}" characters are there?'][kind]  # fmt: skip


def build_set(seed: int = 0):
    """(eval items [(id, text, answer)], queries [(text, answer, source id or None)])."""
    from thresher.selection.decontam import numbers, quoted

    rng = random.Random(seed)
    evals, queries = [], []
    read = [json.loads(line) for line in open(WORDS / "eval.jsonl")]
    for i, r in enumerate(read):
        evals.append((f"wp-{i}", r["prompt"], r["answer"]))
        queries.append((reword_problem(r["prompt"], i % 2, rng), r["answer"], f"wp-{i}"))
    import reasoning_gym

    negatives = []
    for task in TASKS:
        for j, e in enumerate(reasoning_gym.create_dataset(task, size=50, seed=101)):
            evals.append((f"{task}-{j}", e["question"], str(e["answer"])))
            queries.append((reword_rg(task, e["question"], j % 2), str(e["answer"]),
                            f"{task}-{j}"))  # fmt: skip
        for j, e in enumerate(reasoning_gym.create_dataset(task, size=60, seed=202)):
            text = e["question"] if j % 2 else reword_rg(task, e["question"], j % 4 // 2)
            negatives.append((text, str(e["answer"]), e["question"]))
    train = [json.loads(line) for line in open(WORDS / "train.jsonl")]
    for j, r in enumerate(train):
        text = r["prompt"] if j % 2 else reword_problem(r["prompt"], j % 4 // 2, rng)
        negatives.append((text, r["answer"], r["prompt"]))
    taken = {numbers(t) for _, t, _ in evals} | {quoted(t) for _, t, _ in evals if quoted(t)}
    for text, answer, original in negatives:
        if numbers(original) in taken or (quoted(original) and quoted(original) in taken):
            continue  # the same numbers as an item: not a distinct question
        queries.append((text, answer, None))
    return evals, queries


def score(found: list, queries: list) -> dict:
    """Precision and recall of matches (item id or None per query) against the sources."""
    tp = sum(f is not None and f == src for f, (_, _, src) in zip(found, queries, strict=True))
    matches = sum(f is not None for f in found)
    positives = sum(src is not None for _, _, src in queries)
    neg_hits = sum(f is not None for f, (_, _, s) in zip(found, queries, strict=True) if s is None)
    return {
        "recall": tp / positives,
        "precision": tp / matches if matches else 1.0,
        "found": tp,
        "matches": matches,
        "negative_matches": neg_hits,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the table as JSON here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import numpy as np

    from thresher.config import SemanticConfig
    from thresher.selection.decontam import EvalIndex, SemanticIndex, nearest
    from thresher.selection.stage import embed_texts as embeddings
    from thresher.stores.lake import Lake

    evals, queries = build_set(args.seed)
    items = [(i, t) for i, t, _ in evals]
    texts = [t for t, _, _ in queries]
    pos = sum(s is not None for *_, s in queries)
    print(f"{len(evals)} evaluation items; {pos} reworded, {len(queries) - pos} distinct "
          f"items of the same templates")  # fmt: skip
    rows = {}
    for label, index in [
        ("exact text", EvalIndex(n=None)),
        ("13-gram", EvalIndex(n=13)),
        ("13-gram + MinHash 0.8", EvalIndex(n=13, minhash_threshold=0.8)),
        ("13-gram + MinHash 0.5", EvalIndex(n=13, minhash_threshold=0.5)),
    ]:
        rows[label] = score(index.add(items).match(texts), queries)
    cfg = SemanticConfig()
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp) / "lake")
        lake.init()
        t0 = time.perf_counter()
        vectors = embeddings(lake, [t for _, t in items], cfg.model)
        qvec = embeddings(lake, texts, cfg.model)
        seconds = time.perf_counter() - t0
        idx, sims = nearest(qvec, vectors, 1)
        for cut in (0.6, 0.8):
            found = [
                evals[i[0]][0] if s[0] >= cut else None for i, s in zip(idx, sims, strict=True)
            ]
            rows[f"embedding only, nearest >= {cut}"] = score(found, queries)
        sem = SemanticIndex(
            ids=[i for i, _, _ in evals], texts=[t for _, t, _ in evals],
            references=[a for _, _, a in evals], vectors=vectors,
            embed=lambda t: embeddings(lake, t, cfg.model), min_similarity=cfg.min_similarity,
            same_answer_similarity=cfg.same_answer_similarity, neighbours=cfg.neighbours,
        )  # fmt: skip
        got = sem.match(texts, [a for _, a, _ in queries])
        rows["semantic (embedding + evidence)"] = score(
            [g["eval_prompt_id"] if g else None for g in got], queries
        )
    print(f"embedded {len(items) + len(texts)} texts in {seconds:.1f} s")
    print(f"{'check':36s} {'recall':>7s} {'precision':>9s} {'found':>6s} {'matches':>7s} "
          f"{'neg. matches':>12s}")  # fmt: skip
    for label, r in rows.items():
        print(f"{label:36s} {r['recall']:7.3f} {r['precision']:9.3f} {r['found']:6d} "
              f"{r['matches']:7d} {r['negative_matches']:12d}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"queries": len(queries), "positives": pos,
                                        "checks": rows}, indent=1))  # fmt: skip
    del np
    return 0


if __name__ == "__main__":
    sys.exit(main())
