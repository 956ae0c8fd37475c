"""The shape the code keeps: flows take and return models, a curate pass and a bootstrap round
are short declared lists of steps, and every selection rule is a small class."""

from __future__ import annotations

import inspect
import json
import typing

import pytest
from pydantic import BaseModel

from thresher.config import BootstrapConfig, CurateConfig, EvalConfig, TrainConfig
from thresher.flows.bootstrap import ROUND_STEPS, bootstrap_flow
from thresher.flows.curate import BATCH_STEPS, CURATE_STEPS, curate_flow
from thresher.flows.evaluate import eval_flow
from thresher.flows.train import train_flow
from thresher.selection.select import RULES

FLOWS = {
    "curate": (curate_flow, CurateConfig),
    "bootstrap": (bootstrap_flow, BootstrapConfig),
    "train": (train_flow, TrainConfig),
    "evaluate": (eval_flow, EvalConfig),
}
MOST_LINES = 60


@pytest.mark.parametrize("kind", FLOWS)
def test_a_flow_takes_its_config_model_and_returns_a_summary_model(kind):
    flow, model = FLOWS[kind]
    hints = typing.get_type_hints(flow.fn)
    assert hints["config"] is model
    assert inspect.isclass(hints["return"]) and issubclass(hints["return"], BaseModel)
    assert all(h is not typing.Any for h in hints.values())


def test_a_deployments_json_config_arrives_as_its_model():
    """A deployment's run passes the config as the JSON it stores: Prefect validates it
    into the model the flow takes (its annotations are postponed)."""
    stored = {"name": "n", "model": "m", "prompts": {"dataset": "d"}}
    params = curate_flow.validate_parameters({"config": stored, "lake_root": "lake"})
    assert isinstance(params["config"], CurateConfig)
    assert params["config"].prompts.dataset == "d"
    with pytest.raises(Exception, match="prompts"):
        curate_flow.validate_parameters({"config": {"name": "n", "model": "m"}, "lake_root": "x"})


@pytest.mark.parametrize("kind", FLOWS)
def test_a_served_run_validates_its_config_in_the_run_process(kind, tmp_path):
    """A served run's process gets the flow pickled, not imported: its parameter model
    must still turn the stored JSON into the config model there."""
    import subprocess
    import sys

    import cloudpickle

    from thresher.flows.schedule import served_flow

    pickled = tmp_path / "flow.pkl"
    pickled.write_bytes(cloudpickle.dumps(served_flow(kind)))
    code = (
        "import cloudpickle, json, sys\n"
        f"flow = cloudpickle.loads(open({str(pickled)!r}, 'rb').read())\n"
        "params = flow.validate_parameters(json.loads(sys.argv[1]))\n"
        "print(type(params['config']).__name__)\n"
    )
    model = FLOWS[kind][1]
    config = _stored(model)
    ran = subprocess.run(
        [sys.executable, "-c", code, json.dumps({"config": config, "lake_root": "lake"})],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.stdout.strip() == model.__name__, ran.stderr[-2000:]


def _stored(model) -> dict:
    """A config of `model` as a deployment stores it (JSON)."""
    base = {"name": "n", "prompts": {"dataset": "d"}}
    if model is CurateConfig:
        return {**base, "model": "m"}
    if model is EvalConfig:
        return {**base, "model": "m", "prompts": {"dataset": "d", "split": "eval"}}
    if model is TrainConfig:
        return {"name": "n", "base_model": "m"}
    return {**base, "base_model": "m", "eval": {"prompts": {"dataset": "d", "split": "eval"}}}


def _lines(obj) -> int:
    return len(inspect.getsourcelines(obj)[0])


@pytest.mark.parametrize("flow", [curate_flow, bootstrap_flow], ids=["curate", "bootstrap"])
def test_the_curate_and_bootstrap_flows_are_short(flow):
    assert _lines(flow.fn) < MOST_LINES


def test_the_steps_are_declared_and_short():
    steps = [*CURATE_STEPS, *BATCH_STEPS, *ROUND_STEPS]
    assert len(steps) == len(set(steps))
    assert {s.__name__: _lines(s) for s in steps if _lines(s) >= MOST_LINES} == {}


def test_every_selection_rule_is_a_small_class():
    assert len(RULES) >= 10
    assert {type(r).__name__: _lines(type(r)) for r in RULES if _lines(type(r)) >= MOST_LINES} == {}
