"""The eval flow: sample held-out prompts n times, verify, and record pass@k."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow

from thresher.config import EvalConfig
from thresher.flows.runtime import deployment_cleanup, run_in_process, run_name
from thresher.flows.tasks import prompt_batches, sample_task, sampled_batches, verify_task
from thresher.identities import eval_run_id
from thresher.ids import content_id
from thresher.plan import plan_curate
from thresher.stores.lake import Lake


def eval_run_name() -> str:
    """e.g. 'eval demo word-problems round 1'."""
    return run_name("eval")


@flow(name="evaluate", flow_run_name=eval_run_name)
def eval_flow(config: Any, lake_root: str, progress: bool = True) -> dict[str, Any]:
    """pass@k (per task and overall) of a model on held-out prompts, into `evals`."""
    # a model from a command or a parent flow; a deployment's run passes the JSON it stores
    cfg = EvalConfig.model_validate(config)  # a model passes through as it is
    from prefect.utilities.annotations import quote
    from tqdm.auto import tqdm

    from thresher.evaluators.passk import record_pass_at_ks
    from thresher.stores.runs import tracked_run

    cur = cfg.as_curate()
    lake = Lake(lake_root)
    run_id, opening = eval_run_id(cfg), None
    if cfg.final:  # each opening of the sealed test split is a run of its own
        from thresher.stores.queries import test_openings

        opening = len(test_openings(lake, cfg.prompts.dataset)) + 1
        run_id = content_id(run_id, "test-opening", opening)
    plan = replace(plan_curate(cur), run_id=run_id)
    run = dict(flow="evaluate", round_=cfg.round, model=cur.model_id, config=cfg.model_dump())
    with deployment_cleanup(), tracked_run(lake, run_id, **run) as summary:
        if opening is not None:
            summary["test_opening"] = opening
        batches = prompt_batches(lake, cur, open_test=cfg.final)
        n_prompts = sum(len(b) for b in batches)
        every: list[str] = []
        verified = 0
        with tqdm(total=n_prompts, unit="prompt", desc="eval", disable=not progress) as bar:
            for batch, sampled in sampled_batches(
                sample_task, lake_root, cur, run_id, batches, None
            ):
                every += sampled.ids
                verified += verify_task(lake_root, quote(cur), quote(plan), quote(sampled.ids))
                bar.update(len(batch))
        metrics = record_pass_at_ks(lake, every, cfg, run_id, plan.digests, cur.model_id)
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
        if cfg.tracking is not None:
            from thresher.tracking import eval_metrics, log_run

            log_run(cfg.tracking, cfg.name, "evaluate", lake_root, cfg.model_dump(mode="json"),
                    [(cfg.round, eval_metrics(metrics))])  # fmt: skip
    return summary


def run_eval(cfg: EvalConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the eval flow, then stop the engine it started."""
    return run_in_process(eval_flow, cfg, lake_root, progress)
