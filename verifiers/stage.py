"""The verifying stage: score a batch's candidates with each prompt's verifiers, where the
same verifier with the same options has not scored them yet."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from thresher.config import CurateConfig
from thresher.ids import content_id
from thresher.stores.lake import Lake

DeviceSlot = Callable[[str], AbstractContextManager]


def verifier_digests(cfg: CurateConfig) -> dict[str, str]:
    """verifier -> the digest of its version and options: which verdicts the run reads.

    A verifier that judges a prompt's candidates together (`majority`) also has what
    decides how many a prompt has (k, difficulty): with a larger k every candidate of the
    prompt is judged again among all of them, so old and new verdicts cannot disagree."""
    from thresher.verifiers import options_digest, traits

    digests = {}
    for name in cfg.verify.all_names():
        digest = options_digest(name, cfg.verify.options.get(name))
        if traits(name)["groups"]:
            group = {"k": cfg.sampling.k, "difficulty": cfg.difficulty.model_dump()}
            digest = content_id("group-verdicts", digest, group)
        digests[name] = digest
    return digests


def ranking_verifiers(cfg: CurateConfig) -> list[str]:
    """The config's verifiers whose score ranks candidates (the `top_score` policy)."""
    from thresher.verifiers import traits

    return [n for n in cfg.verify.all_names() if traits(n)["ranks"]]


def verify_batch(
    lake: Lake,
    cfg: CurateConfig,
    run_id: str,
    candidate_ids: list[str],
    device_slot: DeviceSlot | None = None,
) -> int:
    """Score these candidates with the verifiers of each prompt's task, where a verifier
    with the same options has not scored them yet; returns verdicts written. A verifier
    with a model on the accelerator runs inside `device_slot(name)`."""
    import polars as pl

    from thresher.stores.queries import (
        candidates_to_verify,
        prompts_to_verify,
        with_strengthened_tests,
    )
    from thresher.stores.tables import write_verdicts
    from thresher.verifiers import get_verifier, runner_for, traits

    run_verifier = runner_for(cfg)
    written = 0
    settings = cfg.verify
    digests = verifier_digests(cfg)
    for name in settings.all_names():
        # a verifier that judges a prompt's candidates together sees all of the batch's
        # (a prompt's candidates are all in one batch); only the missing verdicts are kept
        groups = traits(name)["groups"]
        find = prompts_to_verify if groups else candidates_to_verify
        todo = find(lake, candidate_ids, name, digests[name])
        tasks = [t for t in todo["task"].unique().to_list() if name in settings.for_task(t)]
        todo = todo.filter(pl.col("task").is_in(tasks))
        if todo.height == 0:
            continue
        if (settings.options.get(name) or {}).get("tests") == "strengthened":
            todo = with_strengthened_tests(lake, todo)
        if traits(name)["uses_device"]:
            # a model on the accelerator: scored here, one stage at a time
            with device_slot(name) if device_slot else nullcontext():
                verdicts = get_verifier(name, settings.options.get(name)).run(todo)
        elif groups:  # here, whole prompts at once (the Ray runner splits rows into chunks)
            verdicts = get_verifier(name, settings.options.get(name)).run(todo)
        else:
            verdicts = run_verifier(name, settings.options.get(name), todo)
        if groups:
            missing = todo.filter(pl.col("missing"))["candidate_id"].to_list()
            verdicts = verdicts.filter(pl.col("candidate_id").is_in(missing))
        written += write_verdicts(lake, verdicts, digests[name], run_id)
    return written
