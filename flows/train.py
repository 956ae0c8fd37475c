"""The train flow: fine-tune on a round's selected data and write the next round's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from thresher.config import DecontamConfig, TrainConfig
from thresher.flows.runtime import flow_settings, quiet_task_logs, resolved
from thresher.flows.slots import gpu_slot
from thresher.flows.summaries import TrainSummary
from thresher.identities import rows_digest, train_run_id
from thresher.ingest.load import ingest
from thresher.plan import TrainPlan
from thresher.selection.stage import eval_index
from thresher.stores.lake import Lake
from thresher.stores.models import model_dir_for
from thresher.stores.queries import drop_counts, train_losses
from thresher.stores.runs import latest_run, tracked_run
from thresher.tracking import log_run, numbers
from thresher.trainers import stage as training
from thresher.trainers.mix import mixed_rows
from thresher.trainers.sft import claim_output


def train_output(cfg: TrainConfig, lake: Lake) -> Path:
    """The folder the config's run writes (model/, adapter/, checkpoints/)."""
    return Path(cfg.out) if cfg.out else model_dir_for(lake, cfg.name, cfg.round + 1)


def finished_training(lake: Lake, run_id: str) -> dict[str, Any] | None:
    """The summary of this completed run when its output is still there."""

    run = latest_run(lake, run_id)
    if not run or run["status"] != "completed":
        return None
    summary = run["summary"]
    wanted = [summary.get("model_dir"), summary.get("adapter_dir")]
    if not all(
        Path(p, "config.json").exists() or Path(p, "adapter_config.json").exists()
        for p in wanted
        if p
    ):
        return None
    return summary


def ingest_mix_paths(cfg: TrainConfig, lake: Lake) -> dict[str, list[str]]:
    """Ingest each `path` source of the mix into the lake (preset sft; a re-run adds
    nothing, bad rows go to `rejects`): path -> the prompt ids its file holds now."""

    return {
        src.path: ingest(lake, src.path, src.dataset_name, preset="sft").prompt_ids
        for src in cfg.mix or []
        if src.path is not None
    }


def train_run_name() -> str:
    """e.g. 'train demo model 2'."""
    from prefect.runtime import flow_run

    c = flow_run.parameters.get("config") or {}
    if not isinstance(c, dict):
        c = c.model_dump(include={"name", "round"})
    return f"train {c.get('name', '?')} model {c.get('round', 0) + 1}"


def no_rows_message(cfg: TrainConfig, lake: Lake) -> str:
    """Why there is nothing to train on: the round's drop reasons with their counts."""

    if cfg.data.path or cfg.mix:
        return "no training rows: the data the config names is empty"
    round_ = cfg.data.round if cfg.data.round is not None else cfg.round
    drops = drop_counts(lake, cfg.data.pipeline, round_)
    why = ", ".join(f"{n} {reason}" for reason, n in drops.items()) or "no candidates"
    return f"no training rows: round {round_} kept nothing ({why}; see the funnel view)"


@flow(name="train", flow_run_name=train_run_name)
@resolved
def train_flow(config: TrainConfig, lake_root: str, progress: bool = True) -> TrainSummary:
    """Train model round+1 from the config; resumes from the newest checkpoint, and does
    nothing when this very run already finished and its model is still on disk."""
    return TrainSummary.model_validate(train(config, lake_root, progress))


def train(cfg: TrainConfig, lake_root: str, progress: bool) -> dict[str, Any]:
    """The train flow's work: its summary as recorded."""

    lake = Lake(lake_root)
    mix = None
    if cfg.mix:
        # datasets and files skip selection: keep their eval and test items out here
        index = None
        if any(src.outside_selection for src in cfg.mix):
            index = eval_index(lake, DecontamConfig())
        match = index.match if index is not None else None
        rows, mix = mixed_rows(cfg, lake, ingest_mix_paths(cfg, lake), match)
    else:
        rows = training.load_rows(cfg, lake)
    if not rows:
        raise ValueError(no_rows_message(cfg, lake))
    run_id = train_run_id(cfg, rows)
    done = finished_training(lake, run_id)
    if done:
        return {**done, "already_trained": True}
    out = train_output(cfg, lake)
    base = cfg.base_model
    if cfg.init == "previous" and cfg.round > 0:
        base = str(model_dir_for(lake, cfg.name, cfg.round) / "model")
        if not Path(base).is_dir():
            raise FileNotFoundError(f"no model of round {cfg.round} at {base} to continue from")
    run = dict(flow="train", round_=cfg.round + 1, model=str(out), config=cfg.model_dump())
    with tracked_run(lake, run_id, **run) as summary:
        if claim_output(out, run_id):
            summary["discarded_checkpoints"] = "another run's (other data or settings)"
        if mix:
            summary["mix"] = mix  # set first: a failed run records it too

        with gpu_slot("train", occupy=cfg.distributed.processes):
            plan = TrainPlan(run_id=run_id, base_model=base, out_dir=str(out))
            result = training.run(lake, plan, cfg, rows, progress=progress)
        summary.update(
            {
                "run_id": run_id,
                "rows": len(rows),
                "restated": sum(bool(r.get("restated")) for r in rows),
                "rows_digest": rows_digest(rows),
                "examples": result.examples,
                "skipped": result.skipped,
                "eval_examples": result.eval_examples,
                "eval_skipped": result.eval_skipped,
                "fallback_examples": result.fallback_examples,
                "steps": result.steps,
                "final_loss": result.final_loss,
                "eval_loss": result.eval_loss,
                "tokens_per_s": round(result.tokens_per_s, 1),
                "padding_share": round(result.padding_share, 4),  # of the rows trained
                "unpacked_padding_share": round(result.unpacked_padding_share, 4),
                "model_dir": str(result.model_dir) if result.model_dir else None,
                "adapter_dir": str(result.adapter_dir) if result.adapter_dir else None,
                "resumed_from": result.resumed_from,
                "best_step": result.best_step,
                "best_eval_loss": result.best_eval_loss,
                "stopped_early": result.stopped_early,
                "base_model": base,
            }
        )
        if cfg.tracking is not None:
            steps = [(r["step"], numbers(r, "train/")) for r in train_losses(lake, run_id)]
            steps.append((result.steps, numbers(summary, "summary/")))
            log_run(cfg.tracking, cfg.name, "train", lake_root, cfg.model_dump(mode="json"), steps)
    return summary


def run_train(cfg: TrainConfig, lake_root: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run the train flow for a validated config; returns the run's summary as recorded."""
    quiet_task_logs()
    with flow_settings():
        return train_flow(cfg, str(lake_root), progress).model_dump(exclude_unset=True)
