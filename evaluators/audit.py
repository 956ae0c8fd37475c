"""Audits: how often the verifiers are wrong, measured against human labels.

`verifier_quality` compares the labels with the verdicts (each rate with a 95 % Wilson
interval), `verifier_disagreement` counts where verifiers disagree, and `check_round` gates a
round on its labelled false-pass rate. The sheets to label are drawn and written by
`audit_sheet`.

A candidate's verdict from a verifier is the one the selection's curate run read (its
options digest; the latest, for runs that did not record digests); its label is its
latest label. `rule` stands for the pipeline's
selection rule: passed = not dropped as `failed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from thresher.intervals import wilson_interval
from thresher.stores.lake import Lake
from thresher.stores.queries import latest_curated_round

RULE = "rule"  # the selection rule's verdict, beside each verifier's


class AuditError(ValueError):
    """An audit that cannot be made as asked (no such round or pipeline, no labels)."""


def resolve_pipeline(lake: Lake, round_: int, name: str | None) -> str | None:
    """The pipeline whose round `round_` is audited: `name`, else the only one with a
    selection of that round."""
    found = lake.query(
        "SELECT DISTINCT pipeline FROM current_selections WHERE round = ? ORDER BY pipeline",
        [round_],
    )["pipeline"].to_list()
    if name is not None:
        if name not in found:
            raise AuditError(
                f"pipeline {name!r} has no selection of round {round_} "
                f"(pipelines with one: {', '.join(map(str, found)) or 'none'})"
            )
        return name
    if not found:
        raise AuditError(f"no curated round {round_} in the lake: run `thresher curate` first")
    if len(found) > 1:
        raise AuditError(
            f"several pipelines curated round {round_}: pass --name ({', '.join(map(str, found))})"
        )
    return found[0]


# -- quality --------------------------------------------------------------------------

RATES = {  # rate -> (numerator, the other part of its denominator)
    "false_pass_rate": ("false_pass", "true_fail"),
    "false_fail_rate": ("false_fail", "true_pass"),
    "precision": ("true_pass", "false_pass"),
    "recall": ("true_pass", "false_fail"),
}


def verifier_quality(
    lake: Lake, name: str | None = None, round_: int | None = None
) -> pl.DataFrame:
    """The `verifier_quality` view (of one pipeline and round, when given) with a 95 %
    Wilson interval (`<rate>_low`, `<rate>_high`) beside each rate."""
    q = lake.query("SELECT * FROM verifier_quality")
    if name is not None:
        q = q.filter(pl.col("pipeline") == name)
    if round_ is not None:
        q = q.filter(pl.col("round") == round_)
    columns = []
    for rate, (num, other) in RATES.items():
        bounds = [
            wilson_interval(r[num], r[num] + r[other]) if r[num] + r[other] else (None, None)
            for r in q.iter_rows(named=True)
        ]
        columns += [
            pl.Series(f"{rate}_low", [b[0] for b in bounds], pl.Float64),
            pl.Series(f"{rate}_high", [b[1] for b in bounds], pl.Float64),
        ]
    return q.with_columns(columns)


def quality_shown(quality: pl.DataFrame) -> pl.DataFrame:
    """verifier_quality as people read it: each rate with its interval, `0.1 [0.018,
    0.404]`, or – when it is unmeasured."""
    return quality.select(
        "pipeline", "round", "verifier", "labelled", *(_with_interval(r) for r in RATES)
    )


def _with_interval(rate: str) -> pl.Expr:
    return (
        pl.when(pl.col(rate).is_null())
        .then(pl.lit("–"))
        .otherwise(
            pl.format(
                "{} [{}, {}]",
                *(pl.col(c).round(3) for c in (rate, f"{rate}_low", f"{rate}_high")),
            )
        )
        .alias(rate)
    )


def verifier_disagreement(
    lake: Lake, name: str | None = None, round_: int | None = None
) -> pl.DataFrame:
    """The `verifier_disagreement` view, of one pipeline and round when given."""
    q = lake.query("SELECT * FROM verifier_disagreement")
    if name is not None:
        q = q.filter(pl.col("pipeline") == name)
    if round_ is not None:
        q = q.filter(pl.col("round") == round_)
    return q


@dataclass
class GateResult:
    """The outcome of an audit gate on one round."""

    passed: bool
    lines: list[str]  # one per verifier checked, and why it failed if it did


def check_round(
    lake: Lake,
    name: str | None,
    round_: int,
    max_false_pass: float,
    min_labels: int = 20,
    verifiers: list[str] | None = None,
) -> GateResult:
    """Does the round's labelled false-pass rate of each of `verifiers` (default: the
    selection rule) stay at or under `max_false_pass`, on at least `min_labels` labels?"""
    name = resolve_pipeline(lake, round_, name)
    q = verifier_quality(lake, name, round_)
    ok, lines = True, []
    for v in verifiers or [RULE]:
        got = q.filter(pl.col("verifier") == v)
        if got.is_empty() or got["labelled"][0] < min_labels:
            n = 0 if got.is_empty() else got["labelled"][0]
            ok = False
            lines.append(
                f"{v}: {n} labelled candidates in round {round_} (< {min_labels}): "
                "label an audit sheet first (thresher audit, then thresher audit import)"
            )
            continue
        r = got.row(0, named=True)
        incorrect = r["false_pass"] + r["true_fail"]
        if incorrect == 0:
            lines.append(
                f"{v}: no incorrect candidates among {r['labelled']} labelled: "
                "false-pass rate not measurable, nothing wrong found"
            )
            continue
        rate, low, high = r["false_pass_rate"], r["false_pass_rate_low"], r["false_pass_rate_high"]
        over = rate > max_false_pass
        ok &= not over
        lines.append(
            f"{v}: false-pass rate {rate:.3f} [{low:.3f}, {high:.3f}] "
            f"({r['false_pass']} of {incorrect} incorrect candidates passed; "
            f"{r['labelled']} labelled) {'>' if over else '<='} {max_false_pass}"
        )
    return GateResult(ok, lines)


def flag_rows(lake: Lake, view: str, order: str, round_: int | None = None) -> pl.DataFrame:
    """The rows of a flag view (`contamination`, `suspect_references`), of one round or all."""
    if view not in ("contamination", "suspect_references"):
        raise ValueError(f"{view} is not a flag view")
    return lake.query(
        f"SELECT * FROM {view} WHERE $round IS NULL OR round = $round ORDER BY {order}",
        {"round": round_},
    )


def latest_round(lake: Lake, name: str | None = None) -> int:
    """The latest round the pipeline (default: any pipeline) curated."""
    found = latest_curated_round(lake, name)
    if found is None:
        raise AuditError(
            "no curated rounds" + (f" for pipeline {name!r}" if name else "") + " in the lake"
        )
    return int(found)
