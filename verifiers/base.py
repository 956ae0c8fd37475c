"""The verifier interface: a batch of candidates in, one verdict row per candidate out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Verdict:
    """One verifier's judgement of one candidate."""

    score: float
    passed: bool
    reason: str


def quote(text: object, limit: int = 160) -> str:
    """repr() of `text`, cut to `limit` characters: a reason quotes, it does not copy."""
    s = str(text)
    return repr(s if len(s) <= limit else s[:limit] + "...")


def verdict_frame(
    name: str, candidate_ids: list[str], verdicts: list[Verdict], elapsed_ms: list[float]
) -> pl.DataFrame:
    """Assemble verdicts into the `verdicts` columns."""
    return pl.DataFrame(
        {
            "candidate_id": candidate_ids,
            "verifier": [name] * len(verdicts),
            "score": [float(v.score) for v in verdicts],
            "passed": [bool(v.passed) for v in verdicts],
            "reason": [v.reason for v in verdicts],
            "elapsed_ms": elapsed_ms,
        },
        schema={
            "candidate_id": pl.String,
            "verifier": pl.String,
            "score": pl.Float64,
            "passed": pl.Boolean,
            "reason": pl.String,
            "elapsed_ms": pl.Float64,
        },
    )


def map_rows(name: str, batch: pl.DataFrame, judge: Callable[[dict], Verdict]) -> pl.DataFrame:
    """Run a per-row judge over a batch, timing each row."""
    verdicts, elapsed = [], []
    for row in batch.iter_rows(named=True):
        start = time.perf_counter()
        verdicts.append(judge(row))
        elapsed.append((time.perf_counter() - start) * 1000)
    return verdict_frame(name, batch["candidate_id"].to_list(), verdicts, elapsed)
