"""The Prefect tasks of the engine flows (curate, evaluate), and how batches flow through
them. A task calls one stage function and returns its counts."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff
from prefect.utilities.annotations import quote

from thresher.cluster import is_cluster_failure
from thresher.config import CompactConfig, CurateConfig, SelectConfig, VerifyConfig
from thresher.evaluators.monitors import record_monitors
from thresher.flows.slots import gpu_slot, hold_for_engine
from thresher.plan import Batch, RoundPlan, StagePlan
from thresher.samplers import stage as sampling
from thresher.samplers.openai_server import ServerError
from thresher.samplers.stage import EngineSection, Sampled, batches_in_flight
from thresher.selection import stage as selection
from thresher.stores.lake import Lake
from thresher.stores.maintenance import maybe_compact
from thresher.stores.queries import load_prompts
from thresher.verifiers import stage as verification

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import State, TaskRun


class NothingToCurate(ValueError):
    """The config selects no prompts."""


def transient(task: Task[..., Any], task_run: TaskRun, state: State) -> bool:
    """Retry only what a retry can fix: a server that was down or overloaded, connection
    errors and timeouts, a lost Ray engine or node; never a server's refusal (4xx)."""
    import httpx  # local: only a failed task asks

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
def sample_task(lake_root: str, plan: StagePlan, section: EngineSection, batch: Batch) -> Sampled:
    """Sample what the batch is missing (k per prompt, or `batch.ks[prompt_id]`)."""
    return sampling.run(Lake(lake_root), plan, section, batch, before_engine=hold_for_engine)


@task(name="rationalize", cache_policy=NO_CACHE, **RETRY)
def rationalize_task(
    lake_root: str, plan: RoundPlan, section: CurateConfig, batch: Batch
) -> Sampled:
    """Sample the batch's unsolved prompts again with a hint (the answer, part of a solution)."""
    return sampling.rationalize(Lake(lake_root), plan, section, batch, hold_for_engine)


@task(name="teach", cache_policy=NO_CACHE, **RETRY)
def teach_task(lake_root: str, plan: RoundPlan, section: CurateConfig, batch: Batch) -> Sampled:
    """Sample the prompts the student cannot solve yet with each teacher."""
    return sampling.teach(Lake(lake_root), plan, section, batch, hold_for_engine)


@task(name="verify", cache_policy=NO_CACHE, **RETRY)
def verify_task(lake_root: str, plan: StagePlan, section: VerifyConfig, batch: Batch) -> int:
    """Score the candidates each verifier has not scored yet; returns verdicts written."""
    return verification.run(Lake(lake_root), plan, section, batch, device_slot=gpu_slot).written


@task(name="select", cache_policy=NO_CACHE)
def select_task(lake_root: str, plan: RoundPlan, section: SelectConfig, batch: Batch) -> int:
    """Select the batch's candidates; returns selections written (0: selected already)."""
    return selection.run(Lake(lake_root), plan, section, batch).written


@task(name="monitors", cache_policy=NO_CACHE)
def monitors_task(lake_root: str, name: str, round_: int, run_id: str) -> dict[str, Any]:
    """Measure and record the round's monitors (evaluators.monitors); returns them."""
    return record_monitors(Lake(lake_root), name, round_, run_id)


def prompt_rows(lake: Lake, cfg: EngineSection, open_test: bool = False) -> list[dict]:
    """The config's prompts (id, prompt, messages, answer), ordered by prompt_id (the test
    split only with `open_test`: a final evaluation)."""
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


def prompt_batches(lake: Lake, cfg: EngineSection, open_test: bool = False) -> list[Batch]:
    """The config's prompts in batches of `batch_size`."""
    return [Batch(prompts=b) for b in batched(prompt_rows(lake, cfg, open_test), cfg.batch_size)]


def sampled_batches(
    sample: Task[..., Sampled],
    lake_root: str,
    plan: StagePlan,
    section: EngineSection,
    batches: list[Batch],
) -> Iterator[tuple[Batch, Sampled]]:
    """(batch, its sampling) in batch order, with as many batches sampling at once as
    the sampler wants (a Ray pool: one per engine plus one queued), so the engines keep
    sampling while this process verifies and selects the batches they finished."""
    # quote(): Prefect would otherwise walk every prompt of a batch looking for futures to
    # resolve, which costs more than the task itself
    plan_q, section_q = quote(plan), quote(section)
    window = batches_in_flight(section)
    if window == 1:
        for batch in batches:
            yield batch, sample(lake_root, plan_q, section_q, quote(batch))
        return
    pending: deque = deque()
    for batch in batches:
        pending.append((batch, sample.submit(lake_root, plan_q, section_q, quote(batch))))
        if len(pending) >= window:
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


@task(name="chunk", cache_policy=NO_CACHE)
def chunk_task(lake_root: str, plan: RoundPlan, section: SelectConfig, batch: Batch) -> set[str]:
    """The prompts of these candidates that need no more samples (selection's view)."""
    return selection.satisfied_prompts(Lake(lake_root), plan, section, batch)


def top_up_in_chunks(
    sample: Task[..., Sampled],
    lake_root: str,
    cfg: CurateConfig,
    plan: RoundPlan,
    batch: Batch,
    ks: dict[str, int],
) -> tuple[list[str], int, int]:
    """After a batch's first chunk (its candidates, verified): sample `sampling.chunk` more
    for each prompt whose kept count more samples could still change, verify, and again,
    up to its k. Returns every candidate id of the batch, the candidates written and the
    verdicts written."""
    chunk = cfg.sampling.chunk or 1
    plan_q, cfg_q, select_q, verify_q = (
        quote(plan),
        quote(cfg),
        quote(cfg.select),
        quote(cfg.verify),
    )
    ids, written, verified = list(batch.candidate_ids), 0, 0
    have = {p["prompt_id"]: min(chunk, ks[p["prompt_id"]]) for p in batch.prompts}
    while True:
        done = chunk_task(lake_root, plan_q, select_q, quote(Batch(candidate_ids=ids, ks=ks)))
        more = [
            p
            for p in batch.prompts
            if p["prompt_id"] not in done and have[p["prompt_id"]] < ks[p["prompt_id"]]
        ]
        if not more:
            return ids, written, verified
        for p in more:
            have[p["prompt_id"]] = min(have[p["prompt_id"]] + chunk, ks[p["prompt_id"]])
        step = sample(lake_root, plan_q, cfg_q, quote(Batch(prompts=more, ks=dict(have))))
        written += step.written
        known = set(ids)
        new = [i for i in step.ids if i not in known]
        ids += new
        verified += verify_task(lake_root, plan_q, verify_q, quote(Batch(candidate_ids=new)))


COMPACT_CHECK_EVERY = 100  # batches


def compact_if_due(lake: Lake, settings: CompactConfig) -> dict[str, int]:
    """Compact the tables with many small files; returns files before, per table compacted."""
    done = maybe_compact(lake, settings.after_small_files, settings.target_file_mb)
    return {t: m["files_before"] for t, m in done.items()}
