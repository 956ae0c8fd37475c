"""Alternating two timed sides so the machine's drift falls on both alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")


def abba(a: Callable[[], T], b: Callable[[], U], repeats: int) -> tuple[list[T], list[U]]:
    """Run `a` and `b` `repeats` times each, alternating which goes first (ABBA)."""
    a_runs: list[T] = []
    b_runs: list[U] = []
    for i in range(repeats):
        if i % 2 == 0:
            a_runs.append(a())
            b_runs.append(b())
        else:
            b_runs.append(b())
            a_runs.append(a())
    return a_runs, b_runs
