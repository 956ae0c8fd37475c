"""Hints from verified solutions: the part of a solution a hinted prompt gives, and how much
of a hinted candidate only restates it."""

from __future__ import annotations


def solution_hint(text: str, share: float, answer: str | None = None) -> str | None:
    """The first `share` of a solution's words, stopping before its final answer first
    appears (a hint, not the answer); None when nothing is left."""
    words = text.split()
    n = int(share * len(words))
    at = " ".join(words).find(answer.strip()) if answer and answer.strip() else -1
    if at >= 0:  # the words that end before the answer's first appearance
        ends = [len(" ".join(words[: i + 1])) for i in range(len(words))]
        n = min(n, sum(end <= at for end in ends))
    return " ".join(words[:n]) or None


def copied_share(text: str, hint: str, n: int = 3) -> float:
    """The share of a candidate's words inside a word n-gram of its hint (1.0: it only
    restates the hint)."""
    words, given = text.split(), hint.split()
    grams = {tuple(given[i : i + n]) for i in range(len(given) - n + 1)}
    covered = [False] * len(words)
    for i in range(len(words) - n + 1):
        if tuple(words[i : i + n]) in grams:
            covered[i : i + n] = [True] * n
    return sum(covered) / len(words) if words else 1.0
