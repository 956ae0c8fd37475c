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
    lake: Lake,
    settings: SelectConfig,
    plan: RoundPlan,
    candidate_ids: list[str],
    ks: dict[str, int],
) -> set[str]:
    """The prompts of these candidates whose further samples (up to their k in `ks`)
    cannot change how many candidates selection keeps of them (see `chunk_rule`)."""
    from thresher.stores.queries import selection_inputs

    rows = selection_inputs(lake, candidate_ids, plan.rule, plan.digests or None, plan.ranking)
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        if not r["hinted"]:
            by_prompt.setdefault(r["prompt_id"], []).append(r)
    return {
        p
        for p, group in by_prompt.items()
        if chunk_rule(group, settings.cap, ks[p], settings.max_pass_rate, settings.lowercase)
        is not None
    }


def chunk_rule(
    group: list[dict],
    cap: int,
    k: int,
    max_pass_rate: float | None = None,
    lowercase: bool = False,
) -> str | None:
    """Why a prompt's samples so far (rows with text and passed) settle what selection keeps
    of its k: "too_easy" (more than `max_pass_rate` of k passed, whatever comes next) or
    "cap" (`cap` distinct passing answers, and enough failures that the rest cannot make
    it too easy); None: sample on. The number kept is then the same as with all k."""
    from thresher.selection.select import normalised_hash

    passed = sum(bool(r["passed"]) for r in group)
    failed = len(group) - passed
    if max_pass_rate is not None and passed > max_pass_rate * k:
        return "too_easy"
    distinct = {normalised_hash(r["text"] or "", lowercase) for r in group if r["passed"]}
    if len(distinct) >= cap and (max_pass_rate is None or k - failed <= max_pass_rate * k):
        return "cap"
    return None
