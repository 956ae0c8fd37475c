"""pass@k: the unbiased estimator of Chen et al. (2021), computed stably."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thresher.answers import answer_key
from thresher.config import EvalConfig
from thresher.plan import Batch, EvalPlan
from thresher.rules import rule_sql
from thresher.stores.lake import Lake
from thresher.stores.queries import scoped_verdicts
from thresher.stores.tables import write_evals

FORMAT_METRIC = "format"  # the share of answers in the asked format, beside pass@k

if TYPE_CHECKING:
    import polars as pl


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn from n passes), given c of the n passed.

    1 - C(n-c, k) / C(n, k), as a running product so large n never overflows.
    """
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"k={k} is more than the n={n} samples per prompt")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_counts(
    lake: Lake, candidate_ids: list[str], rule: str | None = None, used: dict | None = None
) -> pl.DataFrame:
    """Per prompt of these candidates: task, n candidates and c passing (by `rule`, over
    the verdicts of the verifiers and options in `used`, verifier -> options digest)."""
    import pyarrow as pa

    con = lake.connect()
    try:
        con.register("cands", pa.table({"candidate_id": pa.array(candidate_ids, pa.string())}))
        verdicts = scoped_verdicts(con, used)
        return con.sql(
            f"""WITH per_candidate AS (
                    SELECT c.candidate_id, c.prompt_id, {rule_sql(rule)} AS passed
                    FROM candidates c JOIN cands USING (candidate_id)
                    LEFT JOIN {verdicts} v ON v.candidate_id = c.candidate_id
                    GROUP BY ALL)
                SELECT p.prompt_id, p.task, p.answer AS reference, count(*) AS n,
                       count(*) FILTER (WHERE passed) AS c
                FROM per_candidate JOIN prompts p USING (prompt_id)
                GROUP BY ALL ORDER BY p.prompt_id"""
        ).pl()
    finally:
        con.close()


def pass_at_ks(counts: pl.DataFrame, ks: list[int]) -> list[dict]:
    """Mean pass@k over prompts, per task and overall ("all")."""
    rows = counts.to_dicts()
    out = []
    for task in ["all", *sorted({r["task"] for r in rows})]:
        part = [r for r in rows if task == "all" or r["task"] == task]
        for k in ks:
            usable = [r for r in part if r["n"] >= k]
            if usable:
                value = sum(pass_at_k(r["n"], r["c"], k) for r in usable) / len(usable)
                out.append(
                    {"task": task, "metric": f"pass@{k}", "value": value, "prompts": len(usable)}
                )
    return out


def prior_metrics(counts: pl.DataFrame) -> list[dict]:
    """Per task and overall ("all"): `constant-answer`, the share of prompts whose reference
    is the task's commonest answer (what always guessing it scores), and `pass@1 non-modal`,
    pass@1 on the other prompts (a gain there is not a prior learnt)."""
    from collections import Counter

    rows = [r for r in counts.to_dicts() if r["n"] >= 1 and r.get("reference") is not None]
    modal: dict[str, str] = {}
    for task in {r["task"] for r in rows}:
        keys = Counter(answer_key(r["reference"]) for r in rows if r["task"] == task)
        modal[task] = min(keys, key=lambda k: (-keys[k], k))  # ties: the first in order
    out = []
    for task in ["all", *sorted(modal)]:
        part = [r for r in rows if task == "all" or r["task"] == task]
        if not part:
            continue
        hits = [answer_key(r["reference"]) == modal[r["task"]] for r in part]
        out.append(
            {"task": task, "metric": "constant-answer", "value": sum(hits) / len(part),
             "prompts": len(part)}
        )  # fmt: skip
        other = [r for r, hit in zip(part, hits, strict=True) if not hit]
        if other:
            value = sum(r["c"] / r["n"] for r in other) / len(other)
            out.append(
                {"task": task, "metric": "pass@1 non-modal", "value": value,
                 "prompts": len(other)}
            )  # fmt: skip
    return out


def tool_metrics(
    lake: Lake, candidate_ids: list[str], rule: str | None = None, used: dict | None = None
) -> list[dict]:
    """Per task and overall, for candidates that could call the tool: `tool calls` (code
    runs per candidate), `tool errors` (the share of runs that failed or timed out), `tool
    used` (the share of candidates that ran code) and `tool used | passed` (the same among
    the candidates that passed by `rule`)."""
    import json

    import pyarrow as pa

    con = lake.connect()
    try:
        con.register("cands", pa.table({"candidate_id": pa.array(candidate_ids, pa.string())}))
        verdicts = scoped_verdicts(con, used)
        rows = con.sql(
            f"""SELECT c.prompt_id, any_value(p.task) AS task,
                       any_value(c.segments) AS segments, {rule_sql(rule)} AS passed
                FROM candidates c JOIN cands USING (candidate_id)
                JOIN prompts p USING (prompt_id)
                LEFT JOIN {verdicts} v ON v.candidate_id = c.candidate_id
                WHERE c.segments IS NOT NULL
                GROUP BY c.candidate_id, c.prompt_id"""
        ).fetchall()
    finally:
        con.close()
    per = []  # (prompt, task, runs, failed runs, passed)
    for prompt, task, segments, passed in rows:
        outs = [s for s in json.loads(segments) if s.get("kind") == "output"]
        per.append((prompt, task, len(outs), sum(s.get("status") != "ok" for s in outs), passed))
    out = []
    for task in ["all", *sorted({r[1] for r in per})]:
        part = [r for r in per if task == "all" or r[1] == task]
        if not part:
            continue
        prompts = len({r[0] for r in part})
        runs = sum(r[2] for r in part)
        values = {
            "tool calls": runs / len(part),
            "tool errors": sum(r[3] for r in part) / runs if runs else None,
            "tool used": sum(r[2] > 0 for r in part) / len(part),
        }
        passing = [r for r in part if r[4]]
        if passing:
            values["tool used | passed"] = sum(r[2] > 0 for r in passing) / len(passing)
        out += [
            {"task": task, "metric": m, "value": v, "prompts": prompts}
            for m, v in values.items()
            if v is not None
        ]
    return out


def protocol_rules(cfg: EvalConfig) -> dict[str, str | None]:
    """metric suffix -> rule: the configured rule (""), and where a verifier of the asked
    format (held-out role "asked_format") is among others and no rule is set, the lenient
    reading without it (" lenient") and the format alone (" format": recorded as `format`,
    the share of answers in the asked format)."""
    names = cfg.verify.all_names()
    formats = cfg.verify.in_role("asked_format")
    rules: dict[str, str | None] = {"": cfg.verify.rule}
    if cfg.verify.rule is None and formats and len(names) > len(formats):
        rules[" lenient"] = " and ".join(n for n in names if n not in formats)
        rules[" format"] = " and ".join(formats)
    return rules


@dataclass
class Measured:
    """One evaluation's metrics: pass@k per task and overall, and what sits beside them."""

    metrics: list[dict] = field(default_factory=list)


def run(lake: Lake, plan: EvalPlan, section: EvalConfig, batch: Batch) -> Measured:
    """pass@k of the batch's candidates (each prompt's n samples) under the plan's verdicts,
    written to `evals`."""
    ids = batch.candidate_ids
    return Measured(record_pass_at_ks(lake, ids, section, plan.run_id, plan.digests, plan.model_id))


def record_pass_at_ks(
    lake: Lake,
    candidate_ids: list[str],
    cfg: EvalConfig,
    run_id: str,
    digests: dict[str, str],
    model: str,
) -> list[dict]:
    """pass@k of these candidates (each prompt's n samples) under the config's rule and
    the verdicts `digests` name, written to `evals`; returns the metrics."""
    metrics = []
    for suffix, rule in protocol_rules(cfg).items():
        counts = pass_counts(lake, candidate_ids, rule, digests)
        if suffix == " format":
            metrics += [{**m, "metric": FORMAT_METRIC} for m in pass_at_ks(counts, [1])]
            continue
        metrics += [{**m, "metric": m["metric"] + suffix} for m in pass_at_ks(counts, cfg.ks)]
        if suffix == "":
            metrics += prior_metrics(counts)
            if cfg.sampling.tools is not None:
                metrics += tool_metrics(lake, candidate_ids, rule, digests)
    write_evals(
        lake,
        metrics,
        run_id,
        round=cfg.round,
        model=model,
        split=cfg.prompts.split,
        samples=cfg.n,
    )
    return metrics
