"""The curate flow: sample k candidates per prompt, verify them, select what survives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.utilities.annotations import quote

from thresher.config import CurateConfig
from thresher.flows.runtime import (
    deployment_cleanup,
    quiet_task_logs,
    run_in_process,
    run_name,
)
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
    top_up_in_chunks,
    verify_task,
)
from thresher.plan import RoundPlan, plan_curate
from thresher.stores.lake import Lake


def curate_run_name() -> str:
    """e.g. 'curate demo word-problems round 0'."""
    return run_name("curate")


@flow(name="curate", flow_run_name=curate_run_name)
def curate_flow(config: Any, lake_root: str, progress: bool = True) -> dict[str, Any]:
    """Sample, verify and select one round for the prompts the config names."""
    # a model from a command or a parent flow; a deployment's run passes the JSON it stores
    cfg = CurateConfig.model_validate(config)  # a model passes through as it is
    from tqdm.auto import tqdm

    from thresher.flows.gates import pipeline_gates
    from thresher.samplers.stage import retired_prompts, run_stats, sampling_plan
    from thresher.stores.queries import band_share, run_summary
    from thresher.stores.runs import tracked_run

    lake = Lake(lake_root)
    plan = plan_curate(cfg)
    run_id, selection_id = plan.run_id, plan.selection_id
    run = dict(flow="curate", round_=cfg.round, model=cfg.model_id, config=cfg.model_dump())
    with (
        deployment_cleanup(),
        tracked_run(lake, run_id, selection_id=selection_id, **run) as summary,
    ):
        summary["verifier_digests"] = plan.digests  # which verdicts it reads
        rm_check = pipeline_gates(lake, cfg)  # before sampling: a bad RM refuses the run
        if rm_check is not None:
            summary["reward_model_check"] = rm_check
        rows = prompt_rows(lake, cfg)
        retired = retired_prompts(lake, cfg)
        ks = sampling_plan(lake, cfg, [r["prompt_id"] for r in rows], retired)
        todo = [r for r in rows if ks[r["prompt_id"]] > 0]
        done = dict(sampled=0, verified=0, selected=0)
        sampling_s, batches_done = 0.0, 0
        quiet_task_logs()
        sample = sample_task.with_options(timeout_seconds=cfg.timeout_s)
        chunk = cfg.sampling.chunk
        first = {p: min(k, chunk) for p, k in ks.items()} if chunk else ks
        cfg_q, plan_q, ks_q = quote(cfg), quote(plan), quote(first)
        with tqdm(total=len(todo), unit="prompt", desc="curate", disable=not progress) as bar:
            for batch, sampled in sampled_batches(
                sample, lake_root, cfg, run_id, batched(todo, cfg.batch_size), ks_q
            ):
                done["sampled"] += sampled.written
                sampling_s += sampled.seconds
                ids = sampled.ids
                done["verified"] += verify_task(lake_root, cfg_q, plan_q, quote(ids))
                if chunk:  # more samples only for prompts selection still wants them for
                    ids, more, verified = top_up_in_chunks(
                        sample, lake_root, cfg, plan, batch, ks, sampled
                    )
                    done["sampled"] += more
                    done["verified"] += verified
                if cfg.rationalize.enabled:
                    hinted = rationalize_task(lake_root, cfg_q, plan_q, quote(batch), quote(ids))
                    done["sampled"] += hinted.written
                    ids = ids + hinted.ids
                    done["verified"] += verify_task(lake_root, cfg_q, plan_q, quote(ids))
                done["selected"] += select_task(lake_root, cfg_q, plan_q, quote(ids))
                bar.update(len(batch))
                batches_done += 1
                if batches_done % COMPACT_CHECK_EVERY == 0:
                    compact_if_due(lake, cfg.compact)
                if sampling_s:
                    bar.set_postfix(candidates_per_s=f"{done['sampled'] / sampling_s:.0f}")
        summary.update(run_stats(cfg))
        summary.update(run_id=run_id, round=cfg.round, **run_summary(lake, selection_id))
        summary.update(
            selection_id=selection_id,
            sampled_now=done["sampled"],
            verified_now=done["verified"],
            selected_now=done["selected"],
            verdicts=verdict_count(lake, plan),
            skipped_solved=sum(k == 0 and p not in retired for p, k in ks.items()),
            retired=sum(p in retired for p in ks),
            band=band_share(
                lake, selection_id, cfg.difficulty.min_pass_rate, cfg.difficulty.max_pass_rate
            ),
            changes=changes_since_last_run(lake, cfg, run_id),
        )
        if cfg.difficulty.hard_k:
            summary["hard_prompts"] = sum(k == cfg.difficulty.hard_k for k in ks.values())
        # distinct answers, similarity, repeated templates, length drift, headroom
        summary["monitors"] = monitors_task(lake_root, cfg.name, cfg.round, run_id)
        compacted = compact_if_due(lake, cfg.compact)
        if compacted:
            summary["compacted"] = compacted
        publish_curate(cfg, summary)
        if cfg.tracking is not None:
            from thresher.tracking import log_run, numbers

            figures = numbers(summary) | numbers(summary.get("monitors") or {}, "monitor/")
            log_run(cfg.tracking, cfg.name, "curate", lake_root, cfg.model_dump(mode="json"),
                    [(cfg.round, figures)])  # fmt: skip
    return summary


def verdict_count(lake: Lake, plan: RoundPlan) -> int:
    """The verdicts this run's candidates have from its verifiers with its options."""
    from thresher.stores.queries import count_verdicts

    return count_verdicts(lake, plan.selection_id, plan.digests)


def changes_since_last_run(lake: Lake, cfg: CurateConfig, run_id: str) -> list[str] | None:
    """What differs from the pipeline's previous run of this round (None: there was none)."""
    from thresher.stores.queries import previous_run
    from thresher.stores.runs import config_changes

    before = previous_run(lake, "curate", cfg.name, cfg.round, run_id)
    if before is None:
        return None
    from thresher.identities import comparable_settings

    return config_changes(comparable_settings(before["config"]), comparable_settings(cfg))


def publish_curate(cfg: CurateConfig, summary: dict[str, Any]) -> None:
    """The run's funnel as a Prefect artifact (Artifacts page, flow run page)."""
    from thresher.flows.artifacts import publish

    keys = ("prompts", "candidates", "sampled_now", "skipped_solved", "retired", "passed")
    keys += ("too_easy",)
    keys += ("truncated_dropped", "contaminated", "duplicates", "capped", "kept")
    publish(
        f"curate-{cfg.name}-round-{cfg.round}",
        f"curate {cfg.name}, round {cfg.round}, model {cfg.model_id}",
        [{k: summary.get(k) for k in keys if summary.get(k) is not None}],
    )


def run_curate(cfg: CurateConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the curate flow for a validated config, then stop the engine it started."""
    return run_in_process(curate_flow, cfg, lake_root, progress)
