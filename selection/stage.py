"""The selecting stage of a curate batch: the config's selection of these candidates, with
the decontamination index built once per process and lake."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thresher.config import DecontamConfig, SelectConfig
from thresher.ids import content_id
from thresher.plan import RoundPlan
from thresher.stores.lake import Lake

if TYPE_CHECKING:
    from thresher.selection.decontam import EvalIndex

_EVAL_INDEXES: dict[str, Any] = {}


def eval_index(lake: Lake, settings: DecontamConfig) -> EvalIndex | None:
    """The decontamination index for these settings (None when off), built once per process
    and lake, and again when the lake's eval prompts change in number."""
    from thresher.selection.decontam import EvalIndex, file_items
    from thresher.stores.queries import eval_items, eval_prompt_count

    if not settings.enabled:
        return None
    key = content_id(lake.location, repr(settings), eval_prompt_count(lake))
    if key not in _EVAL_INDEXES:
        n = None if settings.exact else settings.ngram
        index = EvalIndex(n=n, minhash_threshold=settings.minhash_threshold)
        index.add(eval_items(lake, settings.eval_datasets))
        for path in settings.files:
            index.add(file_items(path))
        _EVAL_INDEXES[key] = index
    return _EVAL_INDEXES[key]


def select_candidates(
    lake: Lake, settings: SelectConfig, plan: RoundPlan, candidate_ids: list[str]
) -> int:
    """Drop failures, easy prompts, contamination and duplicates, cap per prompt, say why;
    returns selections written (0 when this selection of the batch exists already)."""
    from thresher.selection.select import select_batch

    index = eval_index(lake, settings.decontaminate)
    return select_batch(lake, plan, settings, candidate_ids, index)


def satisfied_prompts(
    lake: Lake, settings: SelectConfig, plan: RoundPlan, candidate_ids: list[str], chunk: int
) -> set[str]:
    """The prompts of these candidates that more samples would not change the selection
    of: those with `cap` distinct passing unhinted answers (text, spacing folded), and,
    where `max_pass_rate` drops prompts solved too often, those whose first `chunk`
    samples all passed."""
    from thresher.selection.select import normalised_hash
    from thresher.stores.queries import selection_inputs

    rows = selection_inputs(lake, candidate_ids, plan.rule, plan.digests or None, plan.ranking)
    passing: dict[str, set[str]] = {}
    first: dict[str, list[bool]] = {}
    for r in rows:
        if r["hinted"]:
            continue
        if r["passed"]:
            passing.setdefault(r["prompt_id"], set()).add(
                normalised_hash(r["text"] or "", settings.lowercase)
            )
        if r["sample_idx"] < chunk:
            first.setdefault(r["prompt_id"], []).append(bool(r["passed"]))
    done = {p for p, texts in passing.items() if len(texts) >= settings.cap}
    if settings.max_pass_rate is not None and settings.max_pass_rate < 1:
        done |= {p for p, got in first.items() if len(got) == chunk and all(got)}
    return done
