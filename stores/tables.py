"""The one place each stage table is written from (runs: `runs`).

Every writer takes plain rows or a frame from the stage that made them and adds the
columns that say which run wrote them and when; the lake skips rows whose key is there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thresher.ids import content_id
from thresher.stores.lake import Lake, now

if TYPE_CHECKING:
    import polars as pl


def write_prompts(lake: Lake, rows: list[dict[str, Any]]) -> int:
    """Append ingested prompts (rows as ingest.load makes them; a prompt already there adds
    nothing)."""
    return lake.append("prompts", rows)


def write_candidates(lake: Lake, rows: list[dict[str, Any]]) -> int:
    """Append sampled candidates (rows as samplers.candidate_rows makes them)."""
    return lake.append("candidates", rows)


def write_verdicts(lake: Lake, verdicts: pl.DataFrame, options_digest: str, run_id: str) -> int:
    """Append one verifier's verdicts (a verifier's output frame) under its options digest."""
    import polars as pl

    return lake.append(
        "verdicts",
        verdicts.with_columns(
            pl.lit(options_digest).alias("options_digest"),
            pl.lit(run_id).alias("run_id"),
            pl.lit(now()).alias("created_at"),
        ),
    )


def write_selections(
    lake: Lake, selection_id: str, round_: int, rows: list[dict], run_id: str | None
) -> int:
    """Append one selection's decisions: each row's candidate, prompt and drop `reason`
    (None: kept)."""
    stamp = now()
    return lake.append(
        "selections",
        [
            {
                "selection_id": selection_id,
                "round": round_,
                "candidate_id": r["candidate_id"],
                "prompt_id": r["prompt_id"],
                "kept": r["reason"] is None,
                "drop_reason": r["reason"],
                "run_id": run_id,
                "created_at": stamp,
            }
            for r in rows
        ],
    )


def write_evals(lake: Lake, metrics: list[dict], run_id: str, **columns: Any) -> int:
    """Append an evaluation's metrics (task, metric, value, prompts), with the `columns`
    every row shares (round, model, split, samples)."""
    stamp = now()
    return lake.append(
        "evals", [{**columns, **m, "run_id": run_id, "created_at": stamp} for m in metrics]
    )


def write_train_metrics(lake: Lake, run_id: str, rows: list[dict]) -> int:
    """Append a training run's per-step metrics."""
    stamp = now()
    return lake.append(
        "train_metrics", [{**r, "run_id": run_id, "created_at": stamp} for r in rows]
    )


def reject_row(source: str, line: int, raw: str, reason: str, dataset: str | None) -> dict:
    """A `rejects` row: the input row as read, where it was, and why it was refused."""
    return {
        "reject_id": content_id(source, line, raw, reason),
        "source": source,
        "line": line,
        "dataset": dataset,
        "raw": raw,
        "reason": reason,
        "rejected_at": now(),
    }


def write_rejects(lake: Lake, rows: list[dict]) -> int:
    """Append malformed input rows, each with the reason it was refused."""
    return lake.append("rejects", rows)


def write_labels(lake: Lake, rows: list[dict]) -> int:
    """Append human labels of candidates (a label already in the lake adds nothing)."""
    stamp = now()
    return lake.append("labels", [{**r, "imported_at": stamp} for r in rows])


def write_monitors(lake: Lake, rows: list[dict], run_id: str | None) -> int:
    """Append one round's monitors (selection_id, pipeline, round, metric, value, detail,
    eval_run_id); a monitor already recorded for the same selection adds nothing."""
    stamp = now()
    return lake.append("monitors", [{**r, "run_id": run_id, "created_at": stamp} for r in rows])


def write_test_strength(lake: Lake, rows: list[dict], run_id: str | None) -> int:
    """Append test-strength audits (one row per audit and suite); an audit already
    recorded adds nothing."""
    stamp = now()
    return lake.append(
        "test_strength", [{**r, "run_id": run_id, "created_at": stamp} for r in rows]
    )


def write_embeddings(lake: Lake, model: str, rows: list[tuple[str, list[float]]]) -> int:
    """Append (text id, unit vector) embeddings of one model."""
    stamp = now()
    return lake.append(
        "embeddings",
        [{"text_id": t, "model": model, "vector": v, "created_at": stamp} for t, v in rows],
    )


def write_evidence(
    lake: Lake, selection_id: str, round_: int, rows: list[dict], run_id: str | None
) -> int:
    """Append what one selection's flags rest on (reworded eval items, suspect references)."""
    stamp = now()
    return lake.append(
        "evidence",
        [
            {**r, "selection_id": selection_id, "round": round_, "run_id": run_id,
             "created_at": stamp}
            for r in rows
        ],
    )  # fmt: skip


def write_reference_labels(lake: Lake, rows: list[dict]) -> int:
    """Append people's labels of prompts' references (one already in the lake adds nothing)."""
    stamp = now()
    return lake.append("reference_labels", [{**r, "imported_at": stamp} for r in rows])
