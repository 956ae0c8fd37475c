"""The selecting stage of a curate batch: the config's selection of these candidates, with
the decontamination index built once per process and lake."""

from __future__ import annotations

from typing import Any

from thresher.config import CurateConfig, DecontamConfig
from thresher.ids import content_id
from thresher.stores.lake import Lake

_EVAL_INDEXES: dict[str, Any] = {}


def eval_index(lake: Lake, settings: DecontamConfig):
    """The decontamination index for these settings (None when off), built once per process
    and lake, and again when the lake's eval prompts change in number."""
    from thresher.selection.decontam import EvalIndex, file_items
    from thresher.stores.queries import eval_items, eval_prompt_count

    if not settings.enabled:
        return None
    key = content_id(lake.location, settings.model_dump(), eval_prompt_count(lake))
    if key not in _EVAL_INDEXES:
        n = None if settings.exact else settings.ngram
        index = EvalIndex(n=n, minhash_threshold=settings.minhash_threshold)
        index.add(eval_items(lake, settings.eval_datasets))
        for path in settings.files:
            index.add(file_items(path))
        _EVAL_INDEXES[key] = index
    return _EVAL_INDEXES[key]


def select_candidates(
    lake: Lake,
    cfg: CurateConfig,
    run_id: str,
    candidate_ids: list[str],
    selection_id: str,
    digests: dict[str, str],
    ranking: list[str],
) -> int:
    """Drop failures, easy prompts, contamination and duplicates, cap per prompt, say why;
    returns selections written (0 when this selection of the batch exists already).
    `digests` name the verdicts read; `ranking`, the verifiers whose scores rank."""
    from thresher.selection.select import select_batch

    return select_batch(
        lake,
        selection_id,
        cfg.round,
        candidate_ids,
        cfg.select,
        cfg.verify.rule,
        used=digests,
        ranking=ranking,
        run_id=run_id,
        eval_index=eval_index(lake, cfg.select.decontaminate),
        max_hinted_share=cfg.rationalize.max_share if cfg.rationalize.enabled else None,
        suite=(cfg.verify.options.get("code") or {}).get("tests", "original"),
    )
