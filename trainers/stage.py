"""The training stage: the rows a train config names, and a run that records its metrics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from thresher.config import TrainConfig
from thresher.config.verify import verifiers_in_role
from thresher.plan import TrainPlan
from thresher.stores.export import sft_rows
from thresher.stores.lake import Lake
from thresher.stores.tables import write_train_metrics
from thresher.trainers.launch import run_training

if TYPE_CHECKING:
    from thresher.trainers.sft import TrainResult


def load_rows(cfg: TrainConfig, lake: Lake) -> list[dict[str, Any]]:
    """The SFT rows the config names: a round's kept data in the lake, or a file or
    `datasets` folder on disk."""
    import json

    data = cfg.data
    if data.path:
        path = Path(data.path)
        if path.is_dir():
            import datasets

            return datasets.load_from_disk(str(path)).to_list()
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    round_ = data.round if data.round is not None else cfg.round
    formats = verifiers_in_role("asked_format") if data.restate_format else ()
    return sft_rows(lake, round_, data.all_rounds, data.pipeline, data.restate_format, formats)


def run(
    lake: Lake,
    plan: TrainPlan,
    section: TrainConfig,
    batch: list[dict[str, Any]],
    progress: bool = True,
) -> TrainResult:
    """Train the plan's base model on the batch's rows into the plan's folder, each logged
    step's metrics into `train_metrics`."""
    return train_model(lake, section, plan.run_id, plan.base_model, batch, plan.out_dir, progress)


def train_model(
    lake: Lake,
    cfg: TrainConfig,
    run_id: str,
    base_model: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    progress: bool = True,
) -> TrainResult:
    """Train on `rows` where `cfg.distributed` says, each logged step's metrics into
    `train_metrics` under `run_id`; returns the TrainResult."""

    def on_metrics(steps: list[dict]) -> None:
        write_train_metrics(lake, run_id, steps)

    return run_training(cfg, base_model, rows, out_dir, on_metrics, progress=progress)
