"""Synthetic arithmetic problems with worked answers: the tiny models' texts and the demo's data."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ["Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lea"]
OBJECTS = ["apple", "book", "coin", "shell", "card", "stamp", "marble", "pen", "cup", "kite"]
WORD_TEMPLATES = {
    "+": [
        "{n} has {a} {o}s and finds {b} more. How many {o}s does {n} have now?",
        "{n} had {a} {o}s. A friend gave {n} {b} more. How many {o}s does {n} have?",
    ],
    "-": [
        "{n} has {a} {o}s and gives {b} away. How many {o}s are left?",
        "{n} had {a} {o}s and lost {b} of them. How many {o}s does {n} have left?",
    ],
    "*": [
        "{n} has {a} boxes with {b} {o}s in each box. How many {o}s does {n} have in all?",
        "{n} buys {a} packs of {b} {o}s. How many {o}s does {n} buy?",
    ],
}
WORD_SPLITS = {"seed": 100, "train": 1000, "eval": 200}
TOOL_SPLITS = {"seed": 400, "train": 1000, "eval": 200}
# The tool model's problems use two-digit numbers: too big for its facts, easy for Python.
TOOL_OUTPUT = "\n```output\n{output}\n```\n"  # sampling.tools.output's default


def arithmetic_examples(seed: int = 0) -> list[dict]:
    """Every single-digit sum and product as a prompt with its worked answer.

    One in five goes to the `eval` split; the rest are `train`.
    """
    rows = []
    for a in range(10):
        for b in range(10):
            for op, value in (("+", a + b), ("*", a * b)):
                rows.append(
                    {
                        "id": f"{a}{op}{b}",
                        "prompt": f"What is {a} {op} {b}?",
                        "answer": str(value),
                        "completion": f" {a} {op} {b} = {value}. The answer is {value}.",
                    }
                )
    random.Random(seed).shuffle(rows)
    for i, row in enumerate(rows):
        row["split"] = "eval" if i % 5 == 0 else "train"
    return rows


def arithmetic_facts() -> list[str]:
    """Every fact the word problems use: a + b, (a + b) - b and a * b for small a, b."""
    facts = []
    for a in range(1, 10):
        for b in range(1, 10):
            facts += [f"{a} + {b} = {a + b}", f"{a + b} - {b} = {a}"]
    for a in range(2, 10):
        for b in range(2, 10):
            facts.append(f"{a} * {b} = {a * b}")
    return facts


def _word_problem(rng: random.Random) -> dict:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        value = a * b
    elif op == "+":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        value = a + b
    else:
        b, value = rng.randint(1, 9), rng.randint(1, 9)
        a = b + value
    return {
        "prompt": _word_text(rng, op, a, b),
        "answer": str(value),
        "completion": f" {a} {op} {b} = {value}. The answer is {value}.",
    }


def _tool_problem(rng: random.Random) -> dict:
    op = rng.choice("+-*")
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    call = f" ```python\nprint({a} {op} {b})\n```"
    return {
        "prompt": _word_text(rng, op, a, b),
        "answer": str(value),
        "completion": call + TOOL_OUTPUT.format(output=value) + f"The answer is {value}.",
    }


def _word_text(rng: random.Random, op: str, a: int, b: int) -> str:
    """A word problem's text for `a op b`, its template, name and object drawn from `rng`."""
    return rng.choice(WORD_TEMPLATES[op]).format(
        n=rng.choice(NAMES), o=rng.choice(OBJECTS), a=a, b=b
    )


def _distinct(
    make: Callable[[random.Random], dict], splits: dict[str, int], seed: int
) -> list[dict]:
    """`make`'s problems for each split (name -> size), no problem text twice."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for split, size in splits.items():
        made = 0
        while made < size:
            row = make(rng)
            if row["prompt"] in seen:
                continue
            seen.add(row["prompt"])
            rows.append({"id": f"{split}-{made}", "split": split, **row})
            made += 1
    return rows


def word_problems(splits: dict[str, int], seed: int = 0) -> list[dict]:
    """One-step arithmetic word problems with worked answers, distinct across splits.

    `splits` maps a split name to its size, e.g. {"seed": 300, "train": 1000, "eval": 200};
    no problem text appears twice. Each row: id, split, prompt, answer, completion.
    """
    return _distinct(_word_problem, splits, seed)


def tool_problems(splits: dict[str, int], seed: int = 0) -> list[dict]:
    """Word problems on two-digit numbers whose worked answers call Python for the sum,
    difference or product, distinct across splits (rows as `word_problems` makes them)."""
    return _distinct(_tool_problem, splits, seed)


def write_word_problems(path: str | Path, n: int, seed: int = 0) -> Path:
    """`n` word problems as a JSONL file of prompt, answer, task (ready to ingest)."""
    rows = word_problems({"train": n}, seed=seed)
    Path(path).write_text(
        "".join(
            json.dumps({"prompt": r["prompt"], "answer": r["answer"], "task": "arithmetic"}) + "\n"
            for r in rows
        )
    )
    return Path(path)
