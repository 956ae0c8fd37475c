"""Samplers: k candidate answers per prompt from vLLM (a local engine, a server or a Ray pool)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from thresher.identities import candidate_ids
from thresher.ids import canonical_json

__all__ = ["candidate_rows"]


def candidate_rows(
    prompt_ids: Sequence[str],
    completions: Sequence[Sequence[Any]],
    *,
    model: str,
    round_: int,
    run_id: str,
    batch_id: str,
    params: dict[str, Any],
    hinted: bool = False,
    source: str = "student",
    hints: Sequence[str | None] | None = None,
    indices: Sequence[Sequence[int]] | None = None,
    ids: Sequence[Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Rows of the `candidates` table for each prompt's completions; the i-th completion of
    a prompt gets sample index `indices[p][i]` (default: 0, 1, 2, ...) and, when the caller
    has them already, id `ids[p][i]` (else computed here); `source` says who made them (the
    student, a hint, a teacher) and `hints[p]` is the hint prompt p was given."""
    stamp = datetime.now(UTC)
    rows = []
    for p, (prompt_id, outs) in enumerate(zip(prompt_ids, completions, strict=True)):
        idxs = indices[p] if indices is not None else range(len(outs))
        cids = ids[p] if ids is not None else candidate_ids(prompt_id, model, round_, idxs, params)
        for cid, idx, c in zip(cids, idxs, outs, strict=True):
            rows.append(
                {
                    "candidate_id": cid,
                    "prompt_id": prompt_id,
                    "run_id": run_id,
                    "round": round_,
                    "model": model,
                    "sample_idx": idx,
                    "text": c.text,
                    "n_tokens": c.n_tokens,
                    "finish_reason": c.finish_reason,
                    "segments": canonical_json(list(c.segments)) if c.segments else None,
                    "hinted": hinted,
                    "batch_id": batch_id,
                    "created_at": stamp,
                    "source": source,
                    "hint": hints[p] if hints is not None else None,
                }
            )
    return rows
