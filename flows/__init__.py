"""Orchestration only: the Prefect flows, their gates and schedules, the `thresher` command line."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect import Flow

    from thresher.config import StageConfig

# The temporary Prefect server must not try to reach the internet.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# flow kind -> (module, flow object, config model in thresher.config)
FLOWS: dict[str, tuple[str, str, str]] = {
    "curate": ("thresher.flows.curate", "curate_flow", "CurateConfig"),
    "bootstrap": ("thresher.flows.bootstrap", "bootstrap_flow", "BootstrapConfig"),
    "train": ("thresher.flows.train", "train_flow", "TrainConfig"),
    "evaluate": ("thresher.flows.evaluate", "eval_flow", "EvalConfig"),
}


def flow_object(kind: str) -> Flow[..., Any]:
    """The Prefect flow of a kind (imported when first asked for: flows import Prefect)."""
    import importlib

    module, attr, _ = FLOWS[kind]
    return getattr(importlib.import_module(module), attr)


def config_model(kind: str) -> type[StageConfig]:
    """The config model a flow of this kind takes."""
    from thresher import config  # local: keeps thresher --help fast

    return getattr(config, FLOWS[kind][2])
