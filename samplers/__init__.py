"""Samplers: turn prompts into k candidate answers each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from thresher.ids import content_id


def candidate_id(
    prompt_id: str, model: str, round_: int, sample_idx: int, params: dict[str, Any]
) -> str:
    """The id of one candidate: same prompt, model, round, index and parameters, same id."""
    return content_id("candidate", prompt_id, model, round_, sample_idx, params)


def expected_ids(
    prompt_ids: Sequence[str], model: str, round_: int, k: int, params: dict[str, Any]
) -> list[str]:
    """Every candidate id a complete sampling of these prompts produces."""
    return [candidate_id(p, model, round_, i, params) for p in prompt_ids for i in range(k)]


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
    indices: Sequence[Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """Rows of the `candidates` table for each prompt's completions; the i-th completion of
    a prompt gets sample index `indices[p][i]` (default: 0, 1, 2, ...)."""
    stamp = datetime.now(UTC)
    rows = []
    for p, (prompt_id, outs) in enumerate(zip(prompt_ids, completions, strict=True)):
        idxs = indices[p] if indices is not None else range(len(outs))
        for idx, c in zip(idxs, outs, strict=True):
            rows.append(
                {
                    "candidate_id": candidate_id(prompt_id, model, round_, idx, params),
                    "prompt_id": prompt_id,
                    "run_id": run_id,
                    "round": round_,
                    "model": model,
                    "sample_idx": idx,
                    "text": c.text,
                    "n_tokens": c.n_tokens,
                    "finish_reason": c.finish_reason,
                    "hinted": hinted,
                    "batch_id": batch_id,
                    "created_at": stamp,
                }
            )
    return rows
