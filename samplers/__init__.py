"""Samplers: k candidate answers per prompt from vLLM (a local engine, a server or a Ray pool)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from thresher.identities import sampling_params
from thresher.ids import content_id

__all__ = ["candidate_id", "candidate_ids", "candidate_rows", "expected_ids", "sampling_params"]


def candidate_id(
    prompt_id: str, model: str, round_: int, sample_idx: int, params: dict[str, Any]
) -> str:
    """The id of one candidate: same prompt, model, round, index and parameters, same id."""
    return content_id("candidate", prompt_id, model, round_, sample_idx, params)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _id_parts(model: str, round_: int, params: dict[str, Any]) -> tuple[str, bytes]:
    """The JSON content_id hashes for a candidate, around its prompt id and index."""
    return f",{_dumps(model)},{_dumps(round_)},", f",{_dumps(params)}]".encode()


def _hashed(prompt_id: str, middle: str, tail: bytes, indices: Iterable[int]) -> list[str]:
    head = f'["candidate",{_dumps(prompt_id)}{middle}'.encode()
    return [
        hashlib.blake2b(head + str(int(i)).encode() + tail, digest_size=8).hexdigest()
        for i in indices
    ]


def candidate_ids(
    prompt_id: str, model: str, round_: int, indices: Iterable[int], params: dict[str, Any]
) -> list[str]:
    """`candidate_id` for many sample indices of one prompt, the JSON around the index
    written once (the same text content_id hashes, so the same ids)."""
    return _hashed(prompt_id, *_id_parts(model, round_, params), indices)


def expected_ids(
    prompt_ids: Sequence[str],
    model: str,
    round_: int,
    k: int | Mapping[str, int],
    params: dict[str, Any],
) -> list[str]:
    """Every candidate id a complete sampling of these prompts produces (`k` per prompt,
    or `k[prompt_id]`)."""
    middle, tail = _id_parts(model, round_, params)
    ids = []
    for p in prompt_ids:
        ids += _hashed(p, middle, tail, range(k if isinstance(k, int) else k[p]))
    return ids


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
    ids: Sequence[Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Rows of the `candidates` table for each prompt's completions; the i-th completion of
    a prompt gets sample index `indices[p][i]` (default: 0, 1, 2, ...) and, when the caller
    has them already, id `ids[p][i]` (else computed here)."""
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
                    "segments": _dumps(list(c.segments)) if c.segments else None,
                    "hinted": hinted,
                    "batch_id": batch_id,
                    "created_at": stamp,
                }
            )
    return rows
