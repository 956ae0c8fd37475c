"""Verifiers: score candidates, one verdict row per candidate and verifier."""

from __future__ import annotations

from typing import Any, Protocol

import polars as pl


class Verifier(Protocol):
    name: str
    version: int  # raised when its verdicts change for the same candidate and options
    uses_device: bool  # runs a model on the accelerator: it takes the device slot
    ranks: bool  # its score ranks candidates (the `top_score` selection policy)
    groups: bool  # judges a prompt's candidates together: it is run on all of them
    operational: frozenset[str]  # options of how it runs, not what it finds: not in its digest

    def run(self, batch: pl.DataFrame) -> pl.DataFrame: ...


def registry() -> dict[str, type]:
    """Verifier names and their classes."""
    from thresher.verifiers.code import UnitTests
    from thresher.verifiers.exact import ExactMatch
    from thresher.verifiers.judge import Judge
    from thresher.verifiers.majority import Majority
    from thresher.verifiers.math_answer import MathAnswer
    from thresher.verifiers.reward import RewardModel
    from thresher.verifiers.rules import Choice, Format, Regex

    classes = (
        ExactMatch,
        MathAnswer,
        Choice,
        Regex,
        Format,
        UnitTests,
        RewardModel,
        Judge,
        Majority,
    )
    return {cls.name: cls for cls in classes}


def traits(name: str) -> dict[str, Any]:
    """A registered verifier's version, uses_device, ranks, groups and operational options
    (defaults: 1, False, False, False, none)."""
    cls = registry()[name]
    return {
        "version": getattr(cls, "version", 1),
        "uses_device": getattr(cls, "uses_device", False),
        "ranks": getattr(cls, "ranks", False),
        "groups": getattr(cls, "groups", False),
        "operational": frozenset(getattr(cls, "operational", ())),
    }


def options_digest(name: str, options: dict[str, Any] | None = None) -> str:
    """What identifies a verifier's verdicts besides the candidate: name, version, options
    (those that only say how it runs, such as a judge's concurrency, left out)."""
    from thresher.ids import content_id

    t = traits(name)
    kept = {k: v for k, v in (options or {}).items() if k not in t["operational"]}
    return content_id("verifier", name, t["version"], kept)


def get_verifier(name: str, options: dict[str, Any] | None = None) -> Verifier:
    """The verifier registered under `name`, built with its options."""
    known = registry()
    if name not in known:
        raise KeyError(f"unknown verifier {name!r}; known: {', '.join(sorted(known))}")
    try:
        return known[name](**(options or {}))
    except TypeError as e:
        raise ValueError(f"bad options for verifier {name!r}: {e}") from None


def runner_for(cfg: Any):
    """Where verification runs, chosen once from a config's `executor`: a function from
    (verifier name, options, rows) to verdicts, here or in chunks on its Ray cluster."""
    if getattr(cfg, "executor", "local") == "ray":
        from thresher.verifiers.cluster import verify_on_cluster

        return lambda name, options, rows: verify_on_cluster(cfg.ray, name, options, rows)
    return lambda name, options, rows: get_verifier(name, options).run(rows)


def verify(
    batch: pl.DataFrame, names: list[str], options: dict[str, dict[str, Any]] | None = None
) -> pl.DataFrame:
    """Every named verifier's verdicts on every row of `batch`."""
    options = options or {}
    frames = [get_verifier(name, options.get(name)).run(batch) for name in names]
    return pl.concat(frames) if frames else pl.DataFrame()
