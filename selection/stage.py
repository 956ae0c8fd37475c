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
    """The prompts of these candidates that more samples are unlikely to change the
    selection of: those with `cap` distinct passing unhinted answers (text, spacing
    folded); those whose last chunk added no distinct passing answer to the ones before it
    (the model says the same right thing again); and, where `max_pass_rate` drops prompts
    solved too often, those whose first `chunk` samples all passed."""
    from thresher.stores.queries import selection_inputs

    rows = selection_inputs(lake, candidate_ids, plan.rule, plan.digests or None, plan.ranking)
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        if not r["hinted"]:
            by_prompt.setdefault(r["prompt_id"], []).append(r)
    easy = settings.max_pass_rate is not None and settings.max_pass_rate < 1
    return {
        p
        for p, group in by_prompt.items()
        if chunk_rule(group, settings.cap, chunk, easy, settings.lowercase) is not None
    }


def chunk_rule(
    group: list[dict], cap: int, chunk: int, drops_easy: bool, lowercase: bool = False
) -> str | None:
    """Why a prompt's samples so far (rows with sample_idx, text, passed) need no more:
    "cap", "stalled" or "always" (see `satisfied_prompts`); None: sample on."""
    from thresher.selection.select import normalised_hash

    group = sorted(group, key=lambda r: r["sample_idx"])
    n = len(group)
    passing = [normalised_hash(r["text"] or "", lowercase) if r["passed"] else None for r in group]
    every = len(set(passing) - {None})
    if every >= cap:
        return "cap"
    last = n - (n - 1) % chunk - 1  # where the last chunk started
    before = len(set(passing[:last]) - {None})
    if last > 0 and before >= 1 and every == before:
        return "stalled"
    first = group[:chunk]
    if drops_easy and len(first) == chunk and all(r["passed"] for r in first):
        return "always"
    return None
