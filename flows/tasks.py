"""The Prefect tasks of the engine flows (curate, evaluate), and how batches flow through
them. A task calls one stage function and returns its counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff
from prefect.utilities.annotations import quote

from thresher.config import CompactConfig, CurateConfig
from thresher.plan import RoundPlan
from thresher.samplers.stage import Sampled
from thresher.stores.lake import Lake

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import State, TaskRun


class NothingToCurate(ValueError):
    """The config selects no prompts."""


def transient(task: Task[..., Any], task_run: TaskRun, state: State) -> bool:
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
def sample_task(
    lake_root: str,
    cfg: CurateConfig,
    run_id: str,
    batch: list[dict],
    ks: dict[str, int] | None = None,
) -> Sampled:
    """Sample what the batch is missing (k per prompt, or `ks[prompt_id]`)."""
    from thresher.flows.slots import hold_for_engine
    from thresher.samplers.stage import sample_batch

    return sample_batch(Lake(lake_root), cfg, run_id, batch, ks, before_engine=hold_for_engine)


@task(name="rationalize", cache_policy=NO_CACHE, **RETRY)
def rationalize_task(
    lake_root: str, cfg: CurateConfig, plan: RoundPlan, batch: list[dict], ids: list[str]
) -> Sampled:
    """Sample the batch's unsolved prompts again with the reference answer as a hint."""
    from thresher.flows.slots import hold_for_engine
    from thresher.samplers.stage import rationalize_batch

    return rationalize_batch(Lake(lake_root), cfg, plan, batch, ids, hold_for_engine)


@task(name="verify", cache_policy=NO_CACHE, **RETRY)
def verify_task(lake_root: str, cfg: CurateConfig, plan: RoundPlan, ids: list[str]) -> int:
    """Score the candidates each verifier has not scored yet; returns verdicts written."""
    from thresher.flows.slots import gpu_slot
    from thresher.verifiers.stage import verify_batch

    return verify_batch(Lake(lake_root), cfg, plan, ids, device_slot=gpu_slot)


@task(name="select", cache_policy=NO_CACHE)
def select_task(lake_root: str, cfg: CurateConfig, plan: RoundPlan, ids: list[str]) -> int:
    """Select the batch's candidates; returns selections written (0: selected already)."""
    from thresher.selection.stage import select_candidates

    return select_candidates(Lake(lake_root), cfg.select, plan, ids)


@task(name="monitors", cache_policy=NO_CACHE)
def monitors_task(lake_root: str, name: str, round_: int, run_id: str) -> dict[str, Any]:
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
    sample: Task[..., Sampled],
    lake_root: str,
    cfg: CurateConfig,
    run_id: str,
    batches: list[list[dict]],
    ks_q: quote | None,
) -> Iterator[tuple[list[dict], Sampled]]:
    """(batch, its sampling) in batch order, with as many batches sampling at once as
    the sampler wants (a Ray pool: one per engine plus one queued), so the engines keep
    sampling while this process verifies and selects the batches they finished."""
    from collections import deque

    from thresher.samplers.stage import batches_in_flight

    # quote(): Prefect would otherwise walk every prompt of a batch looking for futures to
    # resolve, which costs more than the task itself
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


@task(name="chunk", cache_policy=NO_CACHE)
def chunk_task(
    lake_root: str, cfg: CurateConfig, plan: RoundPlan, ids: list[str], ks: dict[str, int]
) -> set[str]:
    """The prompts of these candidates that need no more samples (selection's view)."""
    from thresher.selection.stage import satisfied_prompts

    return satisfied_prompts(Lake(lake_root), cfg.select, plan, ids, ks)


def top_up_in_chunks(
    sample: Task[..., Sampled],
    lake_root: str,
    cfg: CurateConfig,
    plan: RoundPlan,
    batch: list[dict],
    ks: dict[str, int],
    sampled: Sampled,
) -> tuple[list[str], int, int]:
    """After a batch's first chunk (verified): sample `sampling.chunk` more for each prompt
    whose kept count more samples could still change, verify, and again, up to its k.
    Returns every candidate id of the batch, the candidates written and the verdicts
    written."""
    chunk = cfg.sampling.chunk or 1
    cfg_q, plan_q, ks_q = quote(cfg), quote(plan), quote(ks)
    ids, written, verified = list(sampled.ids), 0, 0
    have = {p["prompt_id"]: min(chunk, ks[p["prompt_id"]]) for p in batch}
    while True:
        done = chunk_task(lake_root, cfg_q, plan_q, quote(ids), ks_q)
        more = [
            p
            for p in batch
            if p["prompt_id"] not in done and have[p["prompt_id"]] < ks[p["prompt_id"]]
        ]
        if not more:
            return ids, written, verified
        for p in more:
            have[p["prompt_id"]] = min(have[p["prompt_id"]] + chunk, ks[p["prompt_id"]])
        step = sample(lake_root, cfg_q, plan.run_id, quote(more), quote(dict(have)))
        written += step.written
        known = set(ids)
        new = [i for i in step.ids if i not in known]
        ids += new
        verified += verify_task(lake_root, cfg_q, plan_q, quote(new))


COMPACT_CHECK_EVERY = 100  # batches


def compact_if_due(lake: Lake, settings: CompactConfig) -> dict[str, int]:
    """Compact the tables with many small files; returns files before, per table compacted."""
    from thresher.stores.maintenance import maybe_compact

    done = maybe_compact(lake, settings.after_small_files, settings.target_file_mb)
    return {t: m["files_before"] for t, m in done.items()}
