"""The eval flow: sample held-out prompts n times, verify, and record pass@k."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from thresher.config import EvalConfig
from thresher.flows.identities import eval_run_id, verifier_digests
from thresher.ids import content_id
from thresher.stores.lake import Lake


def eval_run_name() -> str:
    """e.g. 'eval demo word-problems round 1'."""
    from thresher.flows.curate import run_name

    return run_name("eval")


@flow(name="evaluate", flow_run_name=eval_run_name)
def eval_flow(config: dict[str, Any], lake_root: str, progress: bool = True) -> dict[str, Any]:
    """pass@k (per task and overall) of a model on held-out prompts, into `evals`."""
    from prefect.utilities.annotations import quote
    from tqdm.auto import tqdm

    from thresher.evaluators.passk import record_pass_at_ks
    from thresher.flows.curate import (
        deployment_cleanup,
        prompt_batches,
        sample_batch,
        sampled_batches,
        verify_batch,
    )
    from thresher.stores.runs import tracked_run

    cfg = EvalConfig(**config)
    cur = cfg.as_curate()
    lake = Lake(lake_root)
    run_id, opening = eval_run_id(cfg), None
    if cfg.final:  # each opening of the sealed test split is a run of its own
        from thresher.stores.queries import test_openings

        opening = len(test_openings(lake, cfg.prompts.dataset)) + 1
        run_id = content_id(run_id, "test-opening", opening)
    run = dict(flow="evaluate", round_=cfg.round, model=cur.model_id, config=config)
    with deployment_cleanup(), tracked_run(lake, run_id, **run) as summary:
        if opening is not None:
            summary["test_opening"] = opening
        batches = prompt_batches(lake, cur, open_test=cfg.final)
        n_prompts = sum(len(b) for b in batches)
        every: list[str] = []
        verified = 0
        with tqdm(total=n_prompts, unit="prompt", desc="eval", disable=not progress) as bar:
            for batch, sampled in sampled_batches(
                sample_batch, lake_root, cur, run_id, batches, None
            ):
                every += sampled.ids
                verified += verify_batch(lake_root, quote(cur), run_id, quote(sampled.ids))
                bar.update(len(batch))
        digests = verifier_digests(cur)
        metrics = record_pass_at_ks(lake, every, cfg, run_id, digests, cur.model_id)
        summary.update(
            run_id=run_id,
            round=cfg.round,
            prompts=n_prompts,
            samples=cfg.n,
            metrics=metrics,
            verified_now=verified,
        )
        from thresher.flows.artifacts import publish

        publish(
            f"eval-{cfg.name}-round-{cfg.round}",
            f"held-out eval of {cur.model_id} (round {cfg.round}, {n_prompts} prompts x {cfg.n})",
            [{"task": m["task"], "metric": m["metric"], "value": m["value"]} for m in metrics],
        )
    return summary


def run_eval(cfg: EvalConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the eval flow, then stop the engine it started."""
    from thresher.flows.curate import quiet_task_logs, stop_engine
    from thresher.flows.runtime import flow_settings

    quiet_task_logs()
    try:
        with flow_settings():
            return eval_flow(cfg.model_dump(), str(lake_root), progress)
    finally:
        stop_engine()
