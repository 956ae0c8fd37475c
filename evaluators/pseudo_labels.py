"""How often the `majority` verifier's pseudo-label is right, measured where a reference
answer exists.

A prompt has a pseudo-label in a round when the majority verifier passed at least one of
its unhinted candidates there. On prompts that also have a reference answer, the label is
checked against another verifier (`against`, the math verifier by default): it is right
when every candidate the majority passed is passed by `against` too, that is when the
majority answer is the reference answer.

Candidates of a round: with `name`, those in pipeline `name`'s current selection of each
round (the curated data the pipeline trains on, rounds as its selections record them);
without, every candidate in the lake by its `round` column (verdicts written outside any
selection count too). Each verifier's latest verdict per candidate counts, whatever its
options (as the `candidate_outcomes` view reads them). Hinted candidates never count.
"""

from __future__ import annotations

import polars as pl

from thresher.intervals import wilson_interval
from thresher.stores.lake import Lake
from thresher.verifiers.majority import Majority

MAJORITY = Majority.name
# the reference check that reads answers as the majority compares them by default
AGAINST = Majority.Options.model_fields["compare"].default

# {candidates}: (round, candidate_id, prompt_id) of the unhinted candidates measured
_SQL = """
WITH cand AS ({candidates}),
latest AS (
    SELECT candidate_id, verifier, passed FROM verdicts
    WHERE verifier IN ($labeller, $against)
    QUALIFY row_number() OVER (
        PARTITION BY candidate_id, verifier ORDER BY created_at DESC) = 1),
judged AS (
    SELECT c.round, c.prompt_id, m.passed AS majority, a.passed AS checked
    FROM cand c
    JOIN latest m ON m.candidate_id = c.candidate_id AND m.verifier = $labeller
    LEFT JOIN latest a ON a.candidate_id = c.candidate_id AND a.verifier = $against),
per_prompt AS (
    SELECT j.round, j.prompt_id,
           bool_or(j.majority) AS labelled,
           count(j.checked) FILTER (WHERE j.majority) > 0 AS checkable,
           coalesce(bool_and(j.checked) FILTER (WHERE j.majority), false) AS label_right,
           any_value(p.answer IS NOT NULL AND trim(p.answer) <> '') AS has_reference
    FROM judged j LEFT JOIN prompts p ON p.prompt_id = j.prompt_id
    GROUP BY j.round, j.prompt_id)
SELECT round,
       count(*) FILTER (WHERE labelled) AS prompts_with_majority,
       count(*) FILTER (WHERE labelled AND NOT has_reference) AS pseudo_labelled,
       count(*) FILTER (WHERE labelled AND has_reference AND checkable) AS checked,
       count(*) FILTER (WHERE labelled AND has_reference AND checkable AND label_right)
           AS majority_right
FROM per_prompt GROUP BY round ORDER BY round
"""

_BY_ROUND = """SELECT c.round, c.candidate_id, c.prompt_id FROM candidates c
               WHERE NOT coalesce(c.hinted, false)"""
_BY_SELECTION = """SELECT DISTINCT s.round, c.candidate_id, c.prompt_id
                   FROM current_selections s JOIN candidates c USING (candidate_id)
                   WHERE s.pipeline = $name AND NOT coalesce(c.hinted, false)"""


def majority_accuracy(lake: Lake, name: str | None = None, against: str = AGAINST) -> pl.DataFrame:
    """Per round: prompts with a pseudo-label, those without a reference (`pseudo_labelled`),
    those checked against a reference, how many labels were right, and that rate with its
    95 % Wilson interval (`low`, `high`; the rate is null when nothing was checked)."""
    if not against or against == MAJORITY:
        raise ValueError(f"against must name another verifier than {MAJORITY!r}")
    params: dict = {"labeller": MAJORITY, "against": against}
    if name is not None:
        params["name"] = name
    source = _BY_ROUND if name is None else _BY_SELECTION
    counts = lake.query(_SQL.format(candidates=source), params)
    bounds = [
        wilson_interval(right, n)
        for right, n in zip(counts["majority_right"], counts["checked"], strict=True)
    ]
    rates = [
        right / n if n else None
        for right, n in zip(counts["majority_right"], counts["checked"], strict=True)
    ]
    return counts.with_columns(
        pl.Series("majority_right_rate", rates, pl.Float64),
        pl.Series("low", [b[0] for b in bounds], pl.Float64),
        pl.Series("high", [b[1] for b in bounds], pl.Float64),
    )
