"""Experiment tracking: a run's config and figures logged to MLflow (a local store in the lake
by default, any tracking URI) and to Weights & Biases where it is installed. The lake stays
the record; a tracker only mirrors it, and a tracker that fails never fails the run."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thresher.config import TrackingConfig


def dotted(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings' values by dotted key: {"a": {"b": 1}} -> {"a.b": 1}."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= dotted(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): value}


def flatten(value: Any) -> dict[str, str]:
    """Nested config values as `a.b.c` -> text (MLflow's params are flat strings)."""
    return {k: str(v)[:6000] for k, v in dotted(value).items()}


def numbers(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a summary (bools and None left out), keys made MLflow-safe."""
    out = {}
    for k, v in values.items():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int | float):
            out[safe_key(prefix + str(k))] = float(v)
    return out


def safe_key(key: str) -> str:
    """An MLflow metric name: letters, digits, `_ - . / :` and spaces; `@` and `|` spelled."""
    key = key.replace("@", "_at_").replace("|", "given")
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in key)


def local_store(lake_root: str) -> tuple[str, str]:
    """The default store, (tracking URI, artifact folder URI): <lake>/mlflow.db (SQLite)
    and <lake>/mlartifacts for a local lake, the same under ./ for a remote one."""
    root = Path(lake_root if "://" not in str(lake_root) else ".").resolve()
    return f"sqlite:///{root / 'mlflow.db'}", (root / "mlartifacts").as_uri()


class Tracker:
    """One run in each configured tracker; every call is a no-op when none is."""

    def __init__(self) -> None:
        self._mlflow = None  # (client, run_id)
        self._wandb = None

    def start(
        self, cfg: TrackingConfig, name: str, flow: str, lake_root: str, params: dict
    ) -> None:
        if cfg.mlflow:
            from mlflow.tracking import MlflowClient

            uri = cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
            artifacts = None
            if uri is None:
                uri, artifacts = local_store(lake_root)
            client = MlflowClient(tracking_uri=uri)
            experiment = cfg.experiment or name
            found = client.get_experiment_by_name(experiment)
            exp_id = (
                found.experiment_id
                if found
                else client.create_experiment(experiment, artifact_location=artifacts)
            )
            run = client.create_run(
                exp_id, run_name=f"{flow} {name}", tags={"thresher.flow": flow, "lake": lake_root}
            )
            flat = flatten(params)
            items = list(flat.items())
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
                from mlflow.entities import Param

                client.log_batch(
                    run.info.run_id, params=[Param(k, v) for k, v in items[i : i + 100]]
                )
            self._mlflow = (client, run.info.run_id)
        if cfg.wandb:
            try:
                import wandb
            except ImportError:
                warnings.warn("tracking.wandb is on but wandb is not installed", stacklevel=2)
            else:
                self._wandb = wandb.init(
                    project=cfg.wandb_project or "thresher",
                    name=f"{flow} {name}",
                    config=params,
                    mode=cfg.wandb_mode or os.environ.get("WANDB_MODE") or "online",
                    reinit=True,
                )

    @property
    def mlflow_run_id(self) -> str | None:
        return self._mlflow[1] if self._mlflow else None

    def metrics(self, values: Mapping[str, float], step: int | None = None) -> None:
        """Log numeric metrics at `step` (a round, a training step)."""
        if not values:
            return
        if self._mlflow:
            import time

            from mlflow.entities import Metric

            client, run_id = self._mlflow
            stamp = int(time.time() * 1000)
            batch = [Metric(k, float(v), stamp, step or 0) for k, v in values.items()]
            for i in range(0, len(batch), 1000):
                client.log_batch(run_id, metrics=batch[i : i + 1000])
        if self._wandb:
            self._wandb.log(dict(values), step=step)

    def artifacts(self, paths: list[Path], folder: str = "report") -> None:
        """Attach files (the report's plots) to the run."""
        if self._mlflow:
            client, run_id = self._mlflow
            for p in paths:
                client.log_artifact(run_id, str(p), folder)
        if self._wandb:
            import wandb

            for p in paths:
                if p.suffix == ".png":
                    self._wandb.log({f"{folder}/{p.stem}": wandb.Image(str(p))})

    def finish(self, ok: bool) -> None:
        if self._mlflow:
            client, run_id = self._mlflow
            client.set_terminated(run_id, "FINISHED" if ok else "FAILED")
        if self._wandb:
            self._wandb.finish(exit_code=0 if ok else 1)


@contextmanager
def tracked(
    cfg: TrackingConfig | None, name: str, flow: str, lake_root: str, params: dict
) -> Iterator[Tracker]:
    """A `Tracker` for one run (a no-op one without a tracking section), finished with the
    run's outcome; a tracker that cannot start warns and the run goes on."""
    tracker = Tracker()
    if cfg is not None:
        try:
            tracker.start(cfg, name, flow, lake_root, params)
        except Exception as e:  # a tracking server that is down must not stop curation
            warnings.warn(f"tracking is off for this run: {e}", stacklevel=2)
            tracker = Tracker()
    ok = False
    try:
        yield tracker
        ok = True
    finally:
        tracker.finish(ok)


def log_run(
    cfg: TrackingConfig | None,
    name: str,
    flow: str,
    lake_root: str,
    params: dict,
    series: list[tuple[int, Mapping[str, float]]],
) -> str | None:
    """Log one finished run: its config and its metrics at each step; returns the MLflow
    run id (None without tracking)."""
    if cfg is None:
        return None
    with tracked(cfg, name, flow, lake_root, params) as tracker:
        for step, values in series:
            tracker.metrics(values, step)
    return tracker.mlflow_run_id


def eval_metrics(metrics: list[Mapping[str, Any]]) -> dict[str, float]:
    """An evaluation's metrics as tracker keys: `pass@1` overall, `<task>/pass@1` per task."""
    out = {}
    for m in metrics:
        if m.get("value") is None:
            continue
        key = m["metric"] if m["task"] == "all" else f"{m['task']}/{m['metric']}"
        out[safe_key(key)] = float(m["value"])
    return out
