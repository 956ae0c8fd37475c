"""The verifying stage: score a batch's candidates with each prompt's verifiers, where the
same verifier with the same options has not scored them yet."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from thresher.config import VerifyConfig
from thresher.plan import Batch, StagePlan
from thresher.segments import model_text
from thresher.stores.lake import Lake
from thresher.stores.queries import candidates_to_verify, prompts_to_verify
from thresher.stores.tables import write_verdicts
from thresher.verifiers import get_verifier, runner_for

DeviceSlot = Callable[[str], AbstractContextManager]


@dataclass
class Verified:
    """One batch's verification: the verdicts written now."""

    written: int = 0


def run(
    lake: Lake,
    plan: StagePlan,
    section: VerifyConfig,
    batch: Batch,
    device_slot: DeviceSlot | None = None,
) -> Verified:
    """Score the batch's candidates with the verifiers of each prompt's task, where a
    verifier with the same options has not scored them yet. A verifier with a model on
    the accelerator runs inside `device_slot(name)`."""
    return Verified(verify_batch(lake, section, plan, batch.candidate_ids, device_slot))


def verify_batch(
    lake: Lake,
    section: VerifyConfig,
    plan: StagePlan,
    candidate_ids: list[str],
    device_slot: DeviceSlot | None = None,
) -> int:
    """Score these candidates with the verifiers of each prompt's task, where a verifier
    with the same options has not scored them yet; returns verdicts written. A verifier
    with a model on the accelerator runs inside `device_slot(name)`."""
    import polars as pl

    run_verifier = runner_for(plan)  # where it runs: chosen once, from the plan
    written = 0
    for spec in plan.verifiers:
        name, options = spec.name, spec.given
        # a verifier that judges a prompt's candidates together sees all of the batch's
        # (a prompt's candidates are all in one batch); only the missing verdicts are kept
        groups = spec.groups
        find = prompts_to_verify if groups else candidates_to_verify
        todo = find(lake, candidate_ids, name, spec.digest)
        tasks = [t for t in todo["task"].unique().to_list() if name in section.for_task(t)]
        todo = todo.filter(pl.col("task").is_in(tasks))
        if todo.height == 0:
            continue
        todo = spec.verifier.prepare_rows(lake, todo, spec.options)
        if not spec.reads_tool_output:
            todo = without_tool_output(todo)
        if spec.uses_device:
            # a model on the accelerator: scored here, one stage at a time
            with device_slot(name) if device_slot else nullcontext():
                verdicts = get_verifier(name, options).run(todo)
        elif groups:  # here, whole prompts at once (the Ray runner splits rows into chunks)
            verdicts = get_verifier(name, options).run(todo)
        else:
            verdicts = run_verifier(name, options, todo)
        if groups:
            missing = todo.filter(pl.col("missing"))["candidate_id"].to_list()
            verdicts = verdicts.filter(pl.col("candidate_id").is_in(missing))
        written += write_verdicts(lake, verdicts, spec.digest, plan.run_id)
    return written


def without_tool_output(batch):
    """The batch with each candidate's text as the model wrote it: a code tool's outputs
    left out (a printed reference is not the model's answer)."""
    import polars as pl

    if "segments" not in batch.columns or batch["segments"].null_count() == batch.height:
        return batch
    texts = [
        model_text(t, s)
        for t, s in zip(batch["text"].to_list(), batch["segments"].to_list(), strict=True)
    ]
    return batch.with_columns(pl.Series("text", texts, dtype=pl.String))
