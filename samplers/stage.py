"""The sampling stage: sample what a batch of prompts is missing, and STaR rationalization.

Candidate ids are content hashes (thresher.identities), computed once per batch here: they
say what exists, what to sample, and which candidates the batch's later stages (verify,
select) read."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from thresher.config import CurateConfig, EvalConfig, TeacherConfig
from thresher.hints import solution_hint
from thresher.identities import expected_ids
from thresher.ids import content_id
from thresher.plan import Batch, RoundPlan, StagePlan, plan_teacher, teacher_source
from thresher.samplers import candidate_rows
from thresher.samplers.difficulty import hinted_prompt, plan_k
from thresher.samplers.engines import sampler_for
from thresher.stores.lake import Lake
from thresher.stores.queries import (
    existing_candidates,
    last_pass_rates,
    passing_solutions,
    sampled_by,
    student_pass_rates,
    unsolved_prompts,
)
from thresher.stores.queries import retired_prompts as streaks
from thresher.stores.schemas import ANSWER_HINT, SOLUTION_HINT, STUDENT
from thresher.stores.tables import write_candidates

# what a sampling stage reads: a config that names a model, how to sample and where
EngineSection = CurateConfig | EvalConfig


@dataclass
class Sampled:
    """One batch's sampling: the ids of all its candidates (existing or new), how many
    were written now and the seconds spent sampling them."""

    ids: list[str] = field(default_factory=list)
    written: int = 0
    seconds: float = 0.0


def batches_in_flight(section: EngineSection) -> int:
    """How many batches to keep sampling at once (the config's sampler says)."""
    return sampler_for(section).in_flight


def run_stats(section: EngineSection) -> dict:
    """Where the run sampled, for its summary."""
    return sampler_for(section).stats()


def sampling_plan(
    lake: Lake, cfg: CurateConfig, prompt_ids: list[str], retired: set[str] | None = None
) -> dict[str, int]:
    """prompt_id -> candidates to sample this round (0: skipped as solved, or retired), from
    the pass rates this pipeline measured in its latest earlier round."""
    band = cfg.difficulty
    retired = retired_prompts(lake, cfg) if retired is None else retired
    if cfg.round == 0 or (band.skip_solved_above is None and band.hard_below is None):
        plan = dict.fromkeys(prompt_ids, cfg.sampling.k)
    else:
        rates = last_pass_rates(lake, cfg.name, cfg.round)
        k = cfg.sampling.k
        plan = plan_k(prompt_ids, k, rates, band.skip_solved_above, band.hard_below, band.hard_k)
    return plan | {p: 0 for p in retired if p in plan}


def retired_prompts(lake: Lake, cfg: CurateConfig) -> set[str]:
    """Prompts this pipeline stops sampling: no passing candidate in `retire_after` rounds
    in a row (they carry no signal and would be resampled forever)."""
    after = cfg.difficulty.retire_after
    if after is None or cfg.round < after:
        return set()
    return streaks(lake, cfg.name, cfg.round, after)


def run(
    lake: Lake,
    plan: StagePlan,
    section: EngineSection,
    batch: Batch,
    before_engine: Callable[[], None] | None = None,
) -> Sampled:
    """Sample the candidates of the batch's prompts not in the lake yet: indices 0..k-1 of
    each prompt (`batch.ks[prompt_id]`, else the plan's k); raising k samples only the new
    indices. `before_engine` runs before a local engine starts (it takes the device)."""
    ks = batch.ks or {p["prompt_id"]: plan.k for p in batch.prompts}
    rows = batch.prompts
    return _sample_missing(lake, plan, section, rows, ks, plan.params, plan.batch_id(batch),
                           STUDENT, before_engine)  # fmt: skip


def rationalize(
    lake: Lake,
    plan: StagePlan,
    section: CurateConfig,
    batch: Batch,
    before_engine: Callable[[], None] | None = None,
) -> Sampled:
    """Sample the batch's unsolved prompts (no passing candidate of the student's own under
    the plan's rule and verdicts) again with a hint: the reference answer (`rationalize`),
    and the first part of a verified solution (`hints`)."""
    unsolved = set(unsolved_prompts(lake, batch.candidate_ids, plan.rule, plan.digests))
    done = Sampled()
    for enabled, sample in (
        (section.rationalize.enabled, _answer_hints),
        (section.hints.enabled, _solution_hints),
    ):
        if enabled:
            more = sample(lake, plan, section, batch, unsolved, before_engine)
            done = Sampled(done.ids + more.ids, done.written + more.written,
                           done.seconds + more.seconds)  # fmt: skip
    return done


def _answer_hints(lake, plan, section, batch, unsolved, before_engine) -> Sampled:
    """The unsolved prompts that have a reference, with it as the hint."""
    hints = section.rationalize
    todo = []
    for p in batch.prompts:
        if p["prompt_id"] in unsolved and p.get("answer") is not None:
            todo.append(_filled(hints.hint, p, answer=p["answer"]))
    if not todo:
        return Sampled()
    params = {**plan.params, "hint": hints.hint}
    hinted = Batch(prompts=todo)
    ks = {p["prompt_id"]: hints.k for p in todo}
    batch_id = plan.batch_id(hinted, hinted=True)
    return _sample_missing(lake, plan, section, todo, ks, params, batch_id, ANSWER_HINT,
                           before_engine)  # fmt: skip


def teach(
    lake: Lake,
    plan: RoundPlan,
    section: CurateConfig,
    batch: Batch,
    before_engine: Callable[[], None] | None = None,
) -> Sampled:
    """Sample the batch's prompts each teacher is aimed at (those the student left unsolved,
    or solved less often than `below`) with that teacher, within its budget for the round."""
    done = Sampled()
    for teacher in section.teachers:
        taught = plan_teacher(section, plan, teacher)
        source = teacher_source(teacher)
        batch_id = content_id("teacher-batch", plan.batch_id(batch), source)
        room = teacher.budget - sampled_by(lake, plan.run_id, source, batch_id)
        prompts = aimed_prompts(lake, plan, teacher, batch)[: max(room, 0) // teacher.k]
        if not prompts:
            continue
        if teacher.template != "{prompt}":
            prompts = [_filled(teacher.template, p) for p in prompts]
        ks = {p["prompt_id"]: teacher.k for p in prompts}
        more = _sample_missing(lake, taught, section.teacher_config(teacher), prompts, ks,
                               taught.params, batch_id, source, before_engine)  # fmt: skip
        done.ids += more.ids
        done.written += more.written
        done.seconds += more.seconds
    return done


def aimed_prompts(lake: Lake, plan: RoundPlan, teacher: TeacherConfig, batch: Batch) -> list[dict]:
    """The batch's prompts `teacher` gets, in batch order: unsolved by the student's own
    candidates, or (aim: below) solved less often than `teacher.below`, hardest first."""
    if teacher.aim == "unsolved":
        unsolved = set(unsolved_prompts(lake, batch.candidate_ids, plan.rule, plan.digests))
        return [p for p in batch.prompts if p["prompt_id"] in unsolved]
    rates = student_pass_rates(lake, batch.candidate_ids, plan.rule, plan.digests)
    aimed = [p for p in batch.prompts if rates.get(p["prompt_id"], 0.0) < teacher.below]
    return sorted(aimed, key=lambda p: rates.get(p["prompt_id"], 0.0))


def _filled(template: str, prompt: dict, **hint: str) -> dict:
    """A prompt row as `template` (with `hint`) makes it: its text, or its last user turn."""
    messages = json.loads(prompt["messages"]) if prompt["messages"] else None
    text, msgs = hinted_prompt(template, prompt["prompt"], messages, **hint)
    return {**prompt, "prompt": text, "messages": json.dumps(msgs) if msgs else None}


def _solution_hints(lake, plan, section, batch, unsolved, before_engine) -> Sampled:
    """The unsolved prompts that have a verified solution (a teacher's, or the student's own
    from an earlier round), each with its first part as the hint; at most `hints.prompts`
    prompts a round."""
    hints = section.hints
    solutions = passing_solutions(lake, sorted(unsolved), plan.round, plan.rule, plan.digests)
    params = {**plan.params, "hint": hints.template, "hint_share": hints.share}
    batch_id = content_id("hint-batch", plan.batch_id(batch), SOLUTION_HINT)
    room = hints.prompts * hints.k - sampled_by(lake, plan.run_id, SOLUTION_HINT, batch_id)
    todo, given = [], {}
    for p in batch.prompts:
        found = solutions.get(p["prompt_id"])
        given_hint = found and solution_hint(found["text"], hints.share, found["answer"])
        if not given_hint or len(todo) >= room // hints.k:
            continue
        todo.append(_filled(hints.template, p, hint=given_hint))
        given[p["prompt_id"]] = given_hint
    if not todo:
        return Sampled()
    ks = {p["prompt_id"]: hints.k for p in todo}
    return _sample_missing(lake, plan, section, todo, ks, params, batch_id, SOLUTION_HINT,
                           before_engine, given)  # fmt: skip


def _sample_missing(
    lake: Lake,
    plan: StagePlan,
    section: EngineSection,
    batch: list[dict],
    ks: dict[str, int],
    params: dict,
    batch_id: str,
    source: str,
    before_engine: Callable[[], None] | None,
    hints: dict[str, str] | None = None,
) -> Sampled:
    expected = {
        p["prompt_id"]: expected_ids(
            [p["prompt_id"]], plan.model_id, plan.round, ks[p["prompt_id"]], params
        )
        for p in batch
    }
    every = [c for ids in expected.values() for c in ids]
    have = existing_candidates(lake, every)
    # raising k samples only the new indices; lowering it reads the first k
    missing = {
        pid: [i for i, c in enumerate(ids) if c not in have] for pid, ids in expected.items()
    }
    todo = [p for p in batch if missing[p["prompt_id"]]]
    done = Sampled(ids=every)
    if not todo:
        return done
    # starts the engine on first use (holding the device slot): not counted as sampling time
    sampler = sampler_for(section, before_engine=before_engine)
    for n in sorted({len(missing[p["prompt_id"]]) for p in todo}):
        group = [p for p in todo if len(missing[p["prompt_id"]]) == n]
        start = time.perf_counter()
        completions = sampler.sample(
            [p["prompt"] for p in group], [p["messages"] for p in group], n
        )
        done.seconds += time.perf_counter() - start
        indices = [missing[p["prompt_id"]] for p in group]
        rows = candidate_rows(
            [p["prompt_id"] for p in group],
            completions,
            model=plan.model_id,
            round_=plan.round,
            run_id=plan.run_id,
            batch_id=batch_id,
            params=params,
            hinted=source != STUDENT,
            source=source,
            hints=[(hints or {}).get(p["prompt_id"]) for p in group],
            indices=indices,
            ids=[
                [expected[p["prompt_id"]][i] for i in idxs]
                for p, idxs in zip(group, indices, strict=True)
            ],
        )
        done.written += write_candidates(lake, rows)
    return done
