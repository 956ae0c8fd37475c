"""The curate flow: sample k candidates per prompt, verify them, select what survives.

A curate run is a declared list of steps over its plan (`CURATE_STEPS`), and each batch of
prompts goes through its own (`BATCH_STEPS`) once sampled; every step calls stage functions
through Prefect tasks and records what it did in the run's summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow
from prefect.utilities.annotations import quote
from tqdm.auto import tqdm

from thresher.config import CurateConfig
from thresher.flows.artifacts import publish
from thresher.flows.gates import pipeline_gates
from thresher.flows.runtime import (
    deployment_cleanup,
    quiet_task_logs,
    resolved,
    run_in_process,
    run_name,
)
from thresher.flows.summaries import CurateSummary
from thresher.flows.tasks import (
    COMPACT_CHECK_EVERY,
    batched,
    compact_if_due,
    monitors_task,
    prompt_rows,
    rationalize_task,
    sample_task,
    sampled_batches,
    select_task,
    teach_task,
    top_up_in_chunks,
    verify_task,
)
from thresher.identities import comparable_settings
from thresher.plan import Batch, RoundPlan, plan_curate
from thresher.samplers.stage import Sampled, retired_prompts, run_stats, sampling_plan
from thresher.selection.select import FUNNEL_DROPS
from thresher.stores.lake import Lake
from thresher.stores.queries import (
    band_share,
    count_verdicts,
    previous_run,
    run_summary,
    source_counts,
)
from thresher.stores.runs import config_changes, tracked_run
from thresher.tracking import log_run, numbers

if TYPE_CHECKING:
    from prefect import Task


@dataclass
class CuratePass:
    """One curate run as it goes: its config, plan and lake, the prompts it samples and
    how many candidates each gets, and the counts its steps add up."""

    cfg: CurateConfig
    plan: RoundPlan
    lake: Lake
    lake_root: str
    summary: dict[str, Any]
    progress: bool = True
    ks: dict[str, int] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)
    todo: list[dict] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict(sampled=0, verified=0, selected=0))
    sampling_s: float = 0.0

    @cached_property
    def sample(self) -> Task[..., Sampled]:
        """The sampling task, each batch's sampling limited to the config's timeout_s."""
        return sample_task.with_options(timeout_seconds=self.cfg.timeout_s)


@dataclass
class BatchWork:
    """One batch of a curate pass: its prompts and its candidates so far."""

    prompts: list[dict]
    ids: list[str]

    def batch(self) -> Any:
        """The batch as the stages take it (quoted: Prefect need not walk its rows)."""
        return quote(Batch(prompts=self.prompts, candidate_ids=self.ids))


def check_gates(run: CuratePass) -> None:
    """Refuse the run before it samples anything (a reward model below its gate)."""
    measured = pipeline_gates(run.lake, run.cfg)
    if measured is not None:
        run.summary["reward_model_check"] = measured


def plan_prompts(run: CuratePass) -> None:
    """Which prompts the run samples and how many candidates each gets."""
    rows = prompt_rows(run.lake, run.cfg)
    run.retired = retired_prompts(run.lake, run.cfg)
    run.ks = sampling_plan(run.lake, run.cfg, [r["prompt_id"] for r in rows], run.retired)
    run.todo = [r for r in rows if run.ks[r["prompt_id"]] > 0]


def verify_step(run: CuratePass, work: BatchWork) -> None:
    """Verify the batch's candidates."""
    run.counts["verified"] += verify_task(
        run.lake_root, quote(run.plan), quote(run.cfg.verify), work.batch()
    )


def top_up_step(run: CuratePass, work: BatchWork) -> None:
    """More samples, a chunk at a time, for prompts whose kept count they could change."""
    if not run.cfg.sampling.chunk:
        return
    batch = Batch(prompts=work.prompts, candidate_ids=work.ids)
    work.ids, more, verified = top_up_in_chunks(
        run.sample, run.lake_root, run.cfg, run.plan, batch, run.ks
    )
    run.counts["sampled"] += more
    run.counts["verified"] += verified


def teach_step(run: CuratePass, work: BatchWork) -> None:
    """Sample the prompts the student left unsolved with each teacher, and verify those."""
    if run.cfg.teachers:
        sample_more(run, work, teach_task)


def rationalize_step(run: CuratePass, work: BatchWork) -> None:
    """Sample unsolved prompts again with a hint (the reference answer, part of a verified
    solution), and verify those."""
    if run.cfg.rationalize.enabled or run.cfg.hints.enabled:
        sample_more(run, work, rationalize_task)


def sample_more(run: CuratePass, work: BatchWork, task: Task[..., Sampled]) -> None:
    """More candidates for the batch from a sampling `task`, added to it and verified."""
    more = task(run.lake_root, quote(run.plan), quote(run.cfg), work.batch())
    run.counts["sampled"] += more.written
    work.ids = work.ids + more.ids
    verify_step(run, work)


def select_step(run: CuratePass, work: BatchWork) -> None:
    """Select the batch's candidates."""
    run.counts["selected"] += select_task(
        run.lake_root, quote(run.plan), quote(run.cfg.select), work.batch()
    )


BATCH_STEPS: tuple[Callable[[CuratePass, BatchWork], None], ...] = (
    verify_step,
    top_up_step,
    teach_step,
    rationalize_step,
    select_step,
)


def curate_batches(run: CuratePass) -> None:
    """Sample the prompts batch by batch, each sampled batch through `BATCH_STEPS`."""
    cfg = run.cfg
    quiet_task_logs()
    chunk = cfg.sampling.chunk
    first = {p: min(k, chunk) for p, k in run.ks.items()} if chunk else run.ks
    batches = [Batch(prompts=b, ks=first) for b in batched(run.todo, cfg.batch_size)]
    bar = tqdm(total=len(run.todo), unit="prompt", desc="curate", disable=not run.progress)
    with bar:
        for i, (batch, sampled) in enumerate(
            sampled_batches(run.sample, run.lake_root, run.plan, cfg, batches), 1
        ):
            run.counts["sampled"] += sampled.written
            run.sampling_s += sampled.seconds
            work = BatchWork(batch.prompts, sampled.ids)
            for step in BATCH_STEPS:
                step(run, work)
            bar.update(len(batch.prompts))
            if i % COMPACT_CHECK_EVERY == 0:
                compact_if_due(run.lake, cfg.compact)
            if run.sampling_s:
                bar.set_postfix(candidates_per_s=f"{run.counts['sampled'] / run.sampling_s:.0f}")


def summarise(run: CuratePass) -> None:
    """The run's funnel, what it reused and where it sampled, into its summary."""
    cfg, plan, lake, ks = run.cfg, run.plan, run.lake, run.ks
    band = cfg.difficulty
    run.summary.update(run_stats(cfg))
    run.summary.update(run_id=plan.run_id, round=cfg.round, **run_summary(lake, plan.selection_id))
    run.summary.update(
        selection_id=plan.selection_id,
        sampled_now=run.counts["sampled"],
        verified_now=run.counts["verified"],
        selected_now=run.counts["selected"],
        verdicts=count_verdicts(lake, plan.selection_id, plan.digests),
        skipped_solved=sum(k == 0 and p not in run.retired for p, k in ks.items()),
        retired=sum(p in run.retired for p in ks),
        band=band_share(lake, plan.selection_id, band.min_pass_rate, band.max_pass_rate),
        changes=changes_since_last_run(lake, cfg, plan.run_id),
        sources=source_counts(lake, plan.selection_id),
    )
    if band.hard_k:
        run.summary["hard_prompts"] = sum(k == band.hard_k for k in ks.values())


def record_monitors(run: CuratePass) -> None:
    """Distinct answers, similarity, repeated templates, length drift, headroom."""
    run.summary["monitors"] = monitors_task(
        run.lake_root, run.cfg.name, run.cfg.round, run.plan.run_id
    )


def compact_lake(run: CuratePass) -> None:
    """Compact the tables the run left with many small files."""
    compacted = compact_if_due(run.lake, run.cfg.compact)
    if compacted:
        run.summary["compacted"] = compacted


def publish_funnel(run: CuratePass) -> None:
    """The run's funnel as a Prefect artifact (Artifacts page, flow run page)."""
    cfg, summary = run.cfg, run.summary
    keys = ("prompts", "candidates", "sampled_now", "skipped_solved", "retired", "passed")
    keys += (*FUNNEL_DROPS, "kept")  # each selection rule's drops, in the rules' order
    row = {k: summary.get(k) for k in keys if summary.get(k) is not None}
    sources = summary.get("sources") or {}
    if len(sources) > 1:
        row |= {f"kept {s}": c["kept"] for s, c in sources.items()}
    publish(
        f"curate-{cfg.name}-round-{cfg.round}",
        f"curate {cfg.name}, round {cfg.round}, model {cfg.model_id}",
        [row],
    )


def track(run: CuratePass) -> None:
    """The run's figures to the tracking server, when the config names one."""
    cfg = run.cfg
    if cfg.tracking is None:
        return
    figures = numbers(run.summary) | numbers(run.summary.get("monitors") or {}, "monitor/")
    for source, counts in (run.summary.get("sources") or {}).items():
        figures |= numbers(counts, f"source/{source}/")
    log_run(cfg.tracking, cfg.name, "curate", run.lake_root, cfg.model_dump(mode="json"),
            [(cfg.round, figures)])  # fmt: skip


CURATE_STEPS: tuple[Callable[[CuratePass], None], ...] = (
    check_gates,
    plan_prompts,
    curate_batches,
    summarise,
    record_monitors,
    compact_lake,
    publish_funnel,
    track,
)


def curate_run_name() -> str:
    """e.g. 'curate demo word-problems round 0'."""
    return run_name("curate")


@flow(name="curate", flow_run_name=curate_run_name)
@resolved
def curate_flow(config: CurateConfig, lake_root: str, progress: bool = True) -> CurateSummary:
    """Sample, verify and select one round for the prompts the config names."""
    lake = Lake(lake_root)
    plan = plan_curate(config)
    run = dict(flow="curate", round_=config.round, model=config.model_id)
    with (
        deployment_cleanup(),
        tracked_run(
            lake, plan.run_id, selection_id=plan.selection_id, config=config.model_dump(), **run
        ) as summary,  # fmt: skip
    ):
        summary["verifier_digests"] = plan.digests  # which verdicts it reads
        state = CuratePass(config, plan, lake, lake_root, summary, progress)
        for step in CURATE_STEPS:
            step(state)
    return CurateSummary.model_validate(summary)


def changes_since_last_run(lake: Lake, cfg: CurateConfig, run_id: str) -> list[str] | None:
    """What differs from the pipeline's previous run of this round (None: there was none)."""
    before = previous_run(lake, "curate", cfg.name, cfg.round, run_id)
    if before is None:
        return None
    return config_changes(comparable_settings(before["config"]), comparable_settings(cfg))


def run_curate(cfg: CurateConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the curate flow for a validated config, then stop the engine it started;
    returns the run's summary as recorded."""
    return run_in_process(curate_flow, cfg, lake_root, progress)
