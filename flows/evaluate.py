"""The eval flow: sample held-out prompts n times, verify, and record pass@k."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.utilities.annotations import quote
from tqdm.auto import tqdm

from thresher.config import EvalConfig
from thresher.evaluators import passk
from thresher.flows.artifacts import publish
from thresher.flows.runtime import deployment_cleanup, resolved, run_in_process, run_name
from thresher.flows.summaries import EvalSummary
from thresher.flows.tasks import prompt_batches, sample_task, sampled_batches, verify_task
from thresher.plan import Batch, plan_eval
from thresher.stores.lake import Lake
from thresher.stores.queries import test_openings
from thresher.stores.runs import tracked_run
from thresher.tracking import eval_metrics, log_run


def eval_run_name() -> str:
    """e.g. 'eval demo word-problems round 1'."""
    return run_name("eval")


@flow(name="evaluate", flow_run_name=eval_run_name)
@resolved
def eval_flow(config: EvalConfig, lake_root: str, progress: bool = True) -> EvalSummary:
    """pass@k (per task and overall) of a model on held-out prompts, into `evals`."""
    lake = Lake(lake_root)
    # each opening of the sealed test split (a final evaluation) is a run of its own
    opening = len(test_openings(lake, config.prompts.dataset)) + 1 if config.final else None
    plan = plan_eval(config, opening)
    run = dict(flow="evaluate", round_=config.round, model=plan.model_id)
    with (
        deployment_cleanup(),
        tracked_run(lake, plan.run_id, config=config.model_dump(), **run) as summary,
    ):
        if opening is not None:
            summary["test_opening"] = opening
        batches = prompt_batches(lake, config, open_test=config.final)
        n_prompts = sum(len(b.prompts) for b in batches)
        every: list[str] = []
        verified = 0
        with tqdm(total=n_prompts, unit="prompt", desc="eval", disable=not progress) as bar:
            for batch, sampled in sampled_batches(sample_task, lake_root, plan, config, batches):
                every += sampled.ids
                done = quote(Batch(candidate_ids=sampled.ids))
                verified += verify_task(lake_root, quote(plan), quote(config.verify), done)
                bar.update(len(batch.prompts))
        metrics = passk.run(lake, plan, config, Batch(candidate_ids=every)).metrics
        summary.update(run_id=plan.run_id, round=config.round, prompts=n_prompts,
                       samples=config.n, metrics=metrics, verified_now=verified)  # fmt: skip
        publish(
            f"eval-{config.name}-round-{config.round}",
            f"held-out eval of {plan.model_id} (round {config.round}, {n_prompts} prompts x "
            f"{config.n})",
            [{"task": m["task"], "metric": m["metric"], "value": m["value"]} for m in metrics],
        )
        if config.tracking is not None:
            figures = [(config.round, eval_metrics(metrics))]
            dumped = config.model_dump(mode="json")
            log_run(config.tracking, config.name, "evaluate", lake_root, dumped, figures)
    return EvalSummary.model_validate(summary)


def run_eval(cfg: EvalConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the eval flow, then stop the engine it started; returns the run's summary as
    recorded."""
    return run_in_process(eval_flow, cfg, lake_root, progress)
