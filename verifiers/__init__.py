"""Verifiers: score candidates, one verdict row per candidate and verifier."""

from __future__ import annotations

from typing import Protocol

import polars as pl


class Verifier(Protocol):
    name: str

    def run(self, batch: pl.DataFrame) -> pl.DataFrame: ...


def get_verifier(name: str) -> Verifier:
    """The verifier registered under `name`."""
    from thresher.verifiers.exact import ExactMatch

    registry = {"exact": ExactMatch}
    if name not in registry:
        raise KeyError(f"unknown verifier {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]()


def verify(batch: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """Every named verifier's verdicts on every row of `batch`."""
    frames = [get_verifier(name).run(batch) for name in names]
    return pl.concat(frames) if frames else pl.DataFrame()
