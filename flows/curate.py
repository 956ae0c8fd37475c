"""The curate flow: sample k candidates per prompt, verify them, select what survives."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff
from prefect.utilities.annotations import quote

from thresher.config import CompactConfig, CurateConfig
from thresher.flows.identities import (
    OPERATIONAL,
    run_id_for,
    selection_id_for,
    verifier_digests,
)
from thresher.samplers.stage import Sampled
from thresher.stores.lake import Lake


class NothingToCurate(ValueError):
    """The config selects no prompts."""


def transient(task, task_run, state) -> bool:
    """Retry only what a retry can fix: a server that was down or overloaded, connection
    errors and timeouts, a lost Ray engine or node; never a server's refusal (4xx)."""
    import httpx

    from thresher.cluster import is_cluster_failure
    from thresher.samplers.openai_server import ServerError

    try:
        state.result()
    except ServerError as e:
        return e.retryable
    except (httpx.TransportError, ConnectionError, TimeoutError):
        return True
    except BaseException as e:
        return is_cluster_failure(e)
    return False


# Sampling, rationalizing and verifying a batch are idempotent (ids are content hashes),
# so a retry redoes only what is missing.
RETRY = dict(
    retries=3,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=transient,
)


@task(name="sample", cache_policy=NO_CACHE, **RETRY)
def sample_batch(
    lake_root: str,
    cfg: CurateConfig,
    run_id: str,
    batch: list[dict],
    ks: dict[str, int] | None = None,
) -> Sampled:
    """Sample what the batch is missing (k per prompt, or `ks[prompt_id]`)."""
    from thresher.flows.slots import hold_for_engine
    from thresher.samplers.stage import sample_batch as sample

    return sample(Lake(lake_root), cfg, run_id, batch, ks, before_engine=hold_for_engine)


@task(name="rationalize", cache_policy=NO_CACHE, **RETRY)
def rationalize_batch(
    lake_root: str, cfg: CurateConfig, run_id: str, batch: list[dict], candidate_ids: list[str]
) -> Sampled:
    """Sample the batch's unsolved prompts again with the reference answer as a hint."""
    from thresher.flows.slots import hold_for_engine
    from thresher.samplers.stage import rationalize_batch as rationalize

    lake, digests = Lake(lake_root), verifier_digests(cfg)
    return rationalize(lake, cfg, run_id, batch, candidate_ids, digests, hold_for_engine)


@task(name="verify", cache_policy=NO_CACHE, **RETRY)
def verify_batch(lake_root: str, cfg: CurateConfig, run_id: str, candidate_ids: list[str]) -> int:
    """Score the candidates each verifier has not scored yet; returns verdicts written."""
    from thresher.flows.slots import gpu_slot
    from thresher.verifiers.stage import verify_batch as verify

    return verify(Lake(lake_root), cfg, run_id, candidate_ids, device_slot=gpu_slot)


@task(name="select", cache_policy=NO_CACHE)
def select_batch(lake_root: str, cfg: CurateConfig, run_id: str, candidate_ids: list[str]) -> int:
    """Select the batch's candidates; returns selections written (0: selected already)."""
    from thresher.selection.stage import select_candidates
    from thresher.verifiers.stage import ranking_verifiers

    return select_candidates(
        Lake(lake_root),
        cfg,
        run_id,
        candidate_ids,
        selection_id_for(cfg),
        verifier_digests(cfg),
        ranking_verifiers(cfg),
    )


@task(name="monitors", cache_policy=NO_CACHE)
def record_round_monitors(lake_root: str, name: str, round_: int, run_id: str) -> dict[str, Any]:
    """Measure and record the round's monitors (evaluators.monitors); returns them."""
    from thresher.evaluators.monitors import record_monitors

    return record_monitors(Lake(lake_root), name, round_, run_id)


def prompt_rows(lake: Lake, cfg: CurateConfig, open_test: bool = False) -> list[dict]:
    """The config's prompts (id, prompt, messages, answer), ordered by prompt_id (the test
    split only with `open_test`: a final evaluation)."""
    from thresher.stores.queries import load_prompts

    p = cfg.prompts
    prompts = load_prompts(lake, p.dataset, p.split, p.limit, p.task, open_test)
    if prompts.height == 0:
        raise NothingToCurate(
            f"no prompts in the lake for dataset={p.dataset!r} split={p.split!r}"
            + (f" task={p.task!r}" if p.task else "")
            + f" (lake: {lake.root}); ingest some with `thresher ingest`"
        )
    return prompts.select("prompt_id", "prompt", "messages", "answer").to_dicts()


def batched(rows: list[dict], size: int) -> list[list[dict]]:
    """`rows` in consecutive batches of `size`."""
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def prompt_batches(lake: Lake, cfg: CurateConfig, open_test: bool = False) -> list[list[dict]]:
    """The config's prompts in batches of `batch_size`."""
    return batched(prompt_rows(lake, cfg, open_test), cfg.batch_size)


def sampled_batches(
    sample, lake_root: str, cfg: CurateConfig, run_id: str, batches: list[list[dict]], ks_q
) -> Iterator[tuple[list[dict], Sampled]]:
    """(batch, its sampling) in batch order, with as many batches sampling at once as
    the sampler wants (a Ray pool: one per engine plus one queued), so the engines keep
    sampling while this process verifies and selects the batches they finished."""
    from collections import deque

    from thresher.samplers.stage import batches_in_flight

    cfg_q = quote(cfg)
    window = batches_in_flight(cfg)
    if window == 1:
        for batch in batches:
            yield batch, sample(lake_root, cfg_q, run_id, quote(batch), ks_q)
        return
    pending: deque = deque()
    for batch in batches:
        pending.append((batch, sample.submit(lake_root, cfg_q, run_id, quote(batch), ks_q)))
        if len(pending) >= window:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


def run_name(kind: str) -> str:
    """The Prefect name of a `kind` run from its config: kind, pipeline, dataset and round."""
    from prefect.runtime import flow_run

    c = flow_run.parameters.get("config", {})
    dataset = (c.get("prompts") or {}).get("dataset", "?")
    return f"{kind} {c.get('name', '?')} {dataset} round {c.get('round', 0)}"


def curate_run_name() -> str:
    """e.g. 'curate demo word-problems round 0'."""
    return run_name("curate")


@flow(name="curate", flow_run_name=curate_run_name)
def curate_flow(config: dict[str, Any], lake_root: str, progress: bool = True) -> dict[str, Any]:
    """Sample, verify and select one round for the prompts the config names."""
    from tqdm.auto import tqdm

    from thresher.flows.gates import reward_model_check
    from thresher.samplers.stage import retired_prompts, run_stats, sampling_plan
    from thresher.stores.queries import band_share, run_summary
    from thresher.stores.runs import tracked_run

    cfg = CurateConfig(**config)
    lake = Lake(lake_root)
    run_id, selection_id = run_id_for(cfg), selection_id_for(cfg)
    run = dict(flow="curate", round_=cfg.round, model=cfg.model_id, config=config)
    with (
        deployment_cleanup(),
        tracked_run(lake, run_id, selection_id=selection_id, **run) as summary,
    ):
        summary["verifier_digests"] = verifier_digests(cfg)  # which verdicts it reads
        rm_check = reward_model_check(lake, cfg)  # before sampling: a bad RM refuses the run
        if rm_check is not None:
            summary["reward_model_check"] = rm_check
        rows = prompt_rows(lake, cfg)
        retired = retired_prompts(lake, cfg)
        ks = sampling_plan(lake, cfg, [r["prompt_id"] for r in rows], retired)
        todo = [r for r in rows if ks[r["prompt_id"]] > 0]
        done = dict(sampled=0, verified=0, selected=0)
        sampling_s, batches_done = 0.0, 0
        quiet_task_logs()
        sample = sample_batch.with_options(timeout_seconds=cfg.timeout_s)
        cfg_q, ks_q = quote(cfg), quote(ks)
        # quote(): Prefect would otherwise walk every prompt of a batch looking for
        # futures to resolve, which costs more than the task itself
        with tqdm(total=len(todo), unit="prompt", desc="curate", disable=not progress) as bar:
            for batch, sampled in sampled_batches(
                sample, lake_root, cfg, run_id, batched(todo, cfg.batch_size), ks_q
            ):
                done["sampled"] += sampled.written
                sampling_s += sampled.seconds
                ids = sampled.ids
                done["verified"] += verify_batch(lake_root, cfg_q, run_id, quote(ids))
                if cfg.rationalize.enabled:
                    hinted = rationalize_batch(lake_root, cfg_q, run_id, quote(batch), quote(ids))
                    done["sampled"] += hinted.written
                    ids = ids + hinted.ids
                    done["verified"] += verify_batch(lake_root, cfg_q, run_id, quote(ids))
                done["selected"] += select_batch(lake_root, cfg_q, run_id, quote(ids))
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
            verdicts=verdict_count(lake, cfg),
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
        summary["monitors"] = record_round_monitors(lake_root, cfg.name, cfg.round, run_id)
        compacted = compact_if_due(lake, cfg.compact)
        if compacted:
            summary["compacted"] = compacted
        publish_curate(cfg, summary)
    return summary


COMPACT_CHECK_EVERY = 100  # batches


def compact_if_due(lake: Lake, settings: CompactConfig) -> dict[str, int]:
    """Compact the tables with many small files; returns files before, per table compacted."""
    from thresher.stores.maintenance import maybe_compact

    done = maybe_compact(lake, settings.after_small_files, settings.target_file_mb)
    return {t: m["files_before"] for t, m in done.items()}


def verdict_count(lake: Lake, cfg: CurateConfig) -> int:
    """The verdicts this run's candidates have from its verifiers with its options."""
    from thresher.stores.queries import count_verdicts

    return count_verdicts(lake, selection_id_for(cfg), verifier_digests(cfg))


def changes_since_last_run(lake: Lake, cfg: CurateConfig, run_id: str) -> list[str] | None:
    """What differs from the pipeline's previous run of this round (None: there was none)."""
    from thresher.stores.queries import previous_run
    from thresher.stores.runs import config_changes

    before = previous_run(lake, "curate", cfg.name, cfg.round, run_id)
    if before is None:
        return None
    from thresher.flows.identities import without_gates

    return config_changes(before["config"], cfg.model_dump(exclude=without_gates(OPERATIONAL)))


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


@contextmanager
def deployment_cleanup() -> Iterator[None]:
    """A deployment's run (scheduled, triggered, served or on a worker) stops its engine
    when it ends, giving the device slot back; `thresher` commands do it themselves,
    and a subflow leaves the engine to its parent (bootstrap reuses it)."""
    try:
        yield
    finally:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        if run is not None and run.deployment_id and run.parent_task_run_id is None:
            stop_engine()


def stop_engine() -> None:
    """Shut the process's engine (or Ray engine pool) down and give its device slot back."""
    from thresher.flows.slots import release_engine_slot
    from thresher.samplers.engines import shutdown

    try:
        shutdown()
    finally:
        release_engine_slot()


def quiet_task_logs(flows: bool = False) -> None:
    """One INFO line per task (and, with `flows`, per subflow) would bury the progress
    bars; keep their warnings and errors."""
    import logging

    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    if flows:
        logging.getLogger("prefect.flow_runs").setLevel(logging.WARNING)


def run_curate(cfg: CurateConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the curate flow for a validated config, then stop the engine it started."""
    from thresher.flows.runtime import flow_settings

    try:
        with flow_settings():
            return curate_flow(cfg.model_dump(), str(lake_root), progress)
    finally:
        stop_engine()
