"""The chunk rule: a prompt sampled in chunks stops exactly when more samples can no
longer change how many candidates selection keeps of it."""

from __future__ import annotations

import random

import pytest

from thresher.selection.stage import chunk_rule


def _rows(outcomes: list[tuple[bool, str]]) -> list[dict]:
    return [{"passed": p, "text": t} for p, t in outcomes]


def _kept(outcomes: list[tuple[bool, str]], cap: int, top: float | None) -> int:
    """By hand, what selection keeps of a prompt's samples: none when more than `top` of
    them passed, else up to `cap` distinct passing texts (spacing folded)."""
    passed = [" ".join(t.split()) for p, t in outcomes if p]
    if top is not None and len(passed) / len(outcomes) > top:
        return 0
    return min(cap, len(set(passed)))


@pytest.mark.parametrize(
    ("outcomes", "cap", "top", "why"),
    [
        ([(True, "a"), (True, "b")], 2, None, "cap"),
        ([(True, "a"), (True, "a  ")], 2, None, None),  # the same text twice: one answer
        ([(True, "a"), (True, "b")], 2, 0.99, None),  # it may yet pass all 8: too easy
        ([(True, "a"), (False, "x"), (True, "b")], 2, 0.99, "cap"),
        ([(True, "a"), (False, "x"), (True, "b")], 2, 0.75, None),  # 7 of 8 could pass
        ([(True, "a"), (False, "x"), (False, "y"), (True, "b")], 2, 0.75, "cap"),
        ([(True, "a")] * 7, 2, 0.75, "too_easy"),  # 7 of 8 passed: too easy whatever comes
        ([(True, "a")] * 6, 2, 0.75, None),
        ([(False, "x")] * 7, 2, 0.99, None),  # a rare solve may still come: sample on
    ],
)
def test_the_rule_by_hand(outcomes, cap, top, why):
    assert chunk_rule(_rows(outcomes), cap, 8, top) == why


@pytest.mark.parametrize("top", [None, 0.99, 0.75, 0.5])
@pytest.mark.parametrize("cap", [1, 2, 4])
def test_stopping_never_changes_the_number_kept(cap, top):
    """Random prompts of 8 samples (each a pass rate, a few distinct answers), sampled in
    chunks of 2 until the rule stops them: the number kept is the one all 8 give."""
    rng = random.Random(f"{cap}-{top}")
    k, chunk, stops = 8, 2, 0
    for _ in range(400):
        rate, answers = rng.random(), rng.randint(1, 4)
        outcomes = [
            (True, f"answer {rng.randrange(answers)}") if rng.random() < rate
            else (False, f"wrong {rng.randrange(9)}")
            for _ in range(k)
        ]  # fmt: skip
        n = chunk
        while n < k and chunk_rule(_rows(outcomes[:n]), cap, k, top) is None:
            n += chunk
        stops += n < k
        assert _kept(outcomes[:n], cap, top) == _kept(outcomes, cap, top), (outcomes, n)
    assert stops > (40 if cap <= 2 else 0)  # and it does stop early
