"""The selecting stage of a curate batch: the config's selection of these candidates, with
the decontamination index built once per process and lake."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thresher.config import DecontamConfig, SelectConfig, SemanticConfig
from thresher.ids import content_id
from thresher.plan import Batch, RoundPlan
from thresher.selection.decontam import EvalIndex, SemanticIndex, file_items
from thresher.selection.select import normalised_hash, select_batch
from thresher.stores.lake import Lake
from thresher.stores.queries import (
    eval_answers,
    eval_items,
    eval_prompt_count,
    selection_inputs,
    stored_embeddings,
)
from thresher.stores.tables import write_embeddings

_EVAL_INDEXES: dict[str, EvalIndex] = {}


@dataclass(frozen=True)
class Selected:
    """What selecting one batch did."""

    written: int  # selections written (0: this selection of the batch exists already)


def eval_index(lake: Lake, settings: DecontamConfig) -> EvalIndex | None:
    """The decontamination index for these settings (None when off), built once per process
    and lake, and again when the lake's eval prompts change in number."""
    if not settings.enabled:
        return None
    key = content_id(lake.location, repr(settings), eval_prompt_count(lake))
    if key not in _EVAL_INDEXES:
        n = None if settings.exact else settings.ngram
        index = EvalIndex(n=n, minhash_threshold=settings.minhash_threshold)
        items = eval_items(lake, settings.eval_datasets)
        index.add(items)
        for path in settings.files:
            more = file_items(path)
            index.add(more)
            items += more
        if settings.semantic is not None:
            index.semantic = semantic_index(lake, settings.semantic, items)
        _EVAL_INDEXES[key] = index
    return _EVAL_INDEXES[key]


def embed_texts(lake: Lake, texts: list[str], model: str, batch_size: int = 64) -> np.ndarray:
    """Unit-length embeddings of `texts` by `model`: those the lake holds are read, the
    rest computed in batches and stored (`embeddings`)."""
    from thresher.embeddings import encode, text_id  # local: torch only when asked

    ids = [text_id(t) for t in texts]
    known = {k: np.asarray(v, dtype=np.float32) for k, v in
             stored_embeddings(lake, sorted(set(ids)), model).items()}  # fmt: skip
    todo = {i: t for i, t in zip(ids, texts, strict=True) if i not in known}
    if todo:
        fresh = dict(zip(todo, encode(list(todo.values()), model, batch_size), strict=True))
        write_embeddings(lake, model, [(i, v.tolist()) for i, v in fresh.items()])
        known.update(fresh)
    if not ids:
        return np.zeros((0, 0), dtype=np.float32)
    return np.vstack([known[i] for i in ids])


def semantic_index(
    lake: Lake, settings: SemanticConfig, items: list[tuple[str, str]]
) -> SemanticIndex:
    """The evaluation items `items` ((id, text)) by embedding, with their references, for
    finding reworded copies of them (embeddings read from the lake or computed and stored)."""

    def embed(texts: list[str]) -> np.ndarray:
        return embed_texts(lake, texts, settings.model, settings.batch_size)

    ids = [i for i, _ in items]
    texts = [t for _, t in items]
    answers = eval_answers(lake, ids)
    return SemanticIndex(
        ids=ids,
        texts=texts,
        references=[answers.get(i) for i in ids],
        vectors=embed(texts) if texts else np.zeros((0, 1), dtype=np.float32),
        embed=embed,
        min_similarity=settings.min_similarity,
        same_answer_similarity=settings.same_answer_similarity,
        neighbours=settings.neighbours,
    )


def run(lake: Lake, plan: RoundPlan, section: SelectConfig, batch: Batch) -> Selected:
    """Select the batch's candidates by the plan and `section`, saying why each dropped one
    was dropped (selection.select.RULES)."""
    index = eval_index(lake, section.decontaminate)
    return Selected(written=select_batch(lake, plan, section, batch.candidate_ids, index))


def satisfied_prompts(lake: Lake, plan: RoundPlan, section: SelectConfig, batch: Batch) -> set[str]:
    """The prompts of the batch's candidates whose further samples (up to their k: in
    `batch.ks`, else the plan's) cannot change how many candidates selection keeps of them
    (see `chunk_rule`)."""
    rows = selection_inputs(
        lake, batch.candidate_ids, plan.rule, plan.digests or None, plan.ranking
    )
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        if not r["hinted"]:
            by_prompt.setdefault(r["prompt_id"], []).append(r)
    ks = batch.ks if batch.ks is not None else dict.fromkeys(by_prompt, plan.k)
    s = section
    return {
        p
        for p, group in by_prompt.items()
        if chunk_rule(group, s.cap, ks[p], s.max_pass_rate, s.lowercase) is not None
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
    passed = sum(bool(r["passed"]) for r in group)
    failed = len(group) - passed
    if max_pass_rate is not None and passed > max_pass_rate * k:
        return "too_easy"
    distinct = {normalised_hash(r["text"] or "", lowercase) for r in group if r["passed"]}
    if len(distinct) >= cap and (max_pass_rate is None or k - failed <= max_pass_rate * k):
        return "cap"
    return None
