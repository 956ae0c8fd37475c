"""Scheduled and triggered runs (`thresher schedule`, `thresher trigger`) against a real
Prefect server, prefect.yaml, and the pieces that need no server."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import ingest_arithmetic, run_module, thresher

from thresher.config import (
    BootstrapConfig,
    CurateConfig,
    EvalConfig,
    TrainConfig,
    load_config,
)
from thresher.flows.schedule import FLOWS, ScheduleError, apply_params, parse_param
from thresher.stores.lake import Lake

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "transformers", "prefect", "datasets")


def _thresher(*args: str, env: dict[str, str], timeout: float = 120):
    return thresher(*args, env=env, timeout=timeout)


# ---------------------------------------------------------------- no server needed


def test_param_paths_and_yaml_values():
    assert parse_param("config.max_rounds=4") == (["config", "max_rounds"], 4)
    assert parse_param("config.sampling.temperature=0.5")[1] == 0.5
    assert parse_param("progress=false") == (["progress"], False)
    assert parse_param("config.eval.ks=[1, 4]")[1] == [1, 4]
    assert parse_param("config.name=a=b") == (["config", "name"], "a=b")
    assert parse_param("config.model=.cache/m")[1] == ".cache/m"
    for bad in ("config.max_rounds", "=4", "config..k=1", "x=[1,"):
        with pytest.raises(ScheduleError):
            parse_param(bad)

    stored = {
        "config": {"name": "n", "max_rounds": 3, "sampling": {"k": 8}, "server": None},
        "lake_root": "/l",
        "progress": False,
    }
    known = {"config", "lake_root", "progress"}
    out = apply_params(
        stored,
        ["config.max_rounds=4", "config.sampling.k=2", "config.server.url=http://h", "progress=1"],
        known,
    )
    assert out == {
        "config": {
            "name": "n",
            "max_rounds": 4,
            "sampling": {"k": 2},
            "server": {"url": "http://h"},
        },
        "lake_root": "/l",
        "progress": 1,
    }
    assert stored["config"]["max_rounds"] == 3 and stored["config"]["server"] is None  # a copy
    with pytest.raises(ScheduleError, match=r"config\.max_rounds"):
        apply_params(stored, ["max_rounds=4"], known)  # not a parameter: says config.
    with pytest.raises(ScheduleError, match="not a mapping"):
        apply_params(stored, ["config.name.x=1"], known)


def test_help_of_the_new_commands_imports_nothing_heavy(tmp_path):
    probe = (
        "import json, sys\n"
        "from thresher.flows.cli import app\n"
        "try:\n"
        "    app(sys.argv[1:], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)\n"
    )
    for args in (
        ["schedule", "--help"],
        ["schedule", "curate", "--help"],
        ["schedule", "bootstrap", "--help"],
        ["schedule", "list", "--help"],
        ["schedule", "pause", "--help"],
        ["trigger", "--help"],
    ):
        res = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=tmp_path
        )
        loaded = json.loads(res.stderr.strip().splitlines()[-1])
        assert "Usage" in res.stdout and loaded == [], (args, loaded)


def test_clear_error_without_a_server(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    res = _thresher("trigger", "x", env=env)
    assert res.returncode == 1
    assert "prefect server start" in res.stderr
    assert "export PREFECT_API_URL=http://127.0.0.1:4200/api" in res.stderr
    assert "Traceback" not in res.stderr
    # a URL nothing answers at
    res = _thresher("schedule", "list", env={**env, "PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert res.returncode == 1 and "cannot reach the Prefect server" in res.stderr
    assert "Traceback" not in res.stderr


def _flow_functions(path: Path) -> set[str]:
    """Names of the module-level functions in `path` decorated with @flow(...)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Name) and target.id == "flow":
                    names.add(node.name)
    return names


def test_prefect_yaml_deployments_are_valid():
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    models = {
        "curate_flow": CurateConfig,
        "bootstrap_flow": BootstrapConfig,
        "train_flow": TrainConfig,
        "eval_flow": EvalConfig,
    }
    deployments = {d["name"]: d for d in doc["deployments"]}
    assert {"curate-demo", "bootstrap-demo"} <= set(deployments)
    for name, d in deployments.items():
        path, func = d["entrypoint"].split(":")
        assert func in _flow_functions(ROOT / path), (name, d["entrypoint"])
        # the same flows `thresher schedule` serves
        assert (f"thresher.flows.{Path(path).stem}", func) in {
            (module, attr) for module, attr, _ in FLOWS.values()
        }
        params = d["parameters"]
        assert set(params) == {"config", "lake_root", "progress"}, name
        models[func](**params["config"])  # strict: a typo fails here
        assert params["progress"] is False
        assert d["work_pool"]["name"] == "thresher"
        assert d["paused"] is True and d["schedules"], name  # nothing runs unasked
    # the inlined configs are the bundled files in configs/
    demo = deployments["curate-demo"]["parameters"]["config"]
    assert CurateConfig(**demo) == load_config(ROOT / "configs" / "demo.yaml")
    boot = deployments["bootstrap-demo"]["parameters"]["config"]
    assert BootstrapConfig(**boot) == load_config(
        ROOT / "configs" / "bootstrap-demo.yaml", BootstrapConfig
    )
    # and Prefect's own reading of the file accepts it
    from prefect.cli.deploy._models import PrefectYamlModel

    PrefectYamlModel.model_validate(doc)


# ---------------------------------------------------------------- a real server


def _api(url: str, method: str, path: str, body=None):
    r = httpx.request(method, f"{url}{path}", json=body, timeout=30)
    r.raise_for_status()
    return r.json()


def _deployment(url: str, full_name: str) -> dict | None:
    r = httpx.get(f"{url}/deployments/name/{full_name}", timeout=30)
    return None if r.status_code == 404 else r.raise_for_status().json()


def _runs(url: str, deployment_id: str) -> list[dict]:
    return _api(
        url,
        "POST",
        "/flow_runs/filter",
        {"deployments": {"id": {"any_": [deployment_id]}}, "limit": 200},
    )


def _ran_after(url: str, run_id: str, moment: datetime) -> bool:
    """Whether the run entered RUNNING after `moment`."""
    states = _api(url, "GET", f"/flow_run_states/?flow_run_id={run_id}")
    return any(
        s["type"] == "RUNNING" and datetime.fromisoformat(s["timestamp"]) > moment for s in states
    )


def _wait(what: str, check, timeout: float, proc=None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-4000:]
            pytest.fail(f"the serving process exited ({proc.returncode}):\n{tail}")
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log else ""
            pytest.fail(f"timed out waiting for {what}\n{tail}")
        time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_schedule_pause_list_trigger_delete(tiny_model, tmp_path, prefect_server, prefect_env):
    url = prefect_server
    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    cfg = tmp_path / "sched.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "sched-e2e",
                "model": str(tiny_model),
                "batch_size": 8,
                "prompts": {"dataset": "arith", "split": "train", "limit": 8},
                "sampling": {"k": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 16},
                "engine": {"dtype": "float32", "max_model_len": 256},
                "verify": {"verifiers": ["math"]},
            }
        )
    )
    env = {
        **prefect_env,
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",  # pick up the triggered run quickly
        "THRESHER_GPU_LIMIT": "gpu-schedule-test",  # this test's own device limit
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "thresher.flows.cli",
            "schedule",
            "curate",
            "-c",
            str(cfg),
            "--interval",
            "5",
            "--name",
            "sched-test",
            "--lake",
            str(lake.root),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=tmp_path,
    )
    try:
        dep = _wait(
            "the deployment",
            lambda: _deployment(url, "curate/sched-test"),
            60,
            serve,
            log_path,
        )
        assert dep["parameters"]["lake_root"] == str(lake.root.resolve())
        assert dep["parameters"]["progress"] is False
        assert dep["parameters"]["config"]["sampling"]["k"] == 2
        assert dep["entrypoint"] == "thresher.flows.curate.curate_flow"

        # the schedule starts runs by itself (the first one starts the engine)
        _wait(
            "a scheduled run to complete",
            lambda: [r for r in _runs(url, dep["id"]) if r["state_type"] == "COMPLETED"],
            300,
            serve,
            log_path,
        )
        assert all(r["auto_scheduled"] for r in _runs(url, dep["id"]))
        assert lake.query("SELECT count(*) FROM candidates")[0, 0] == 8 * 2
        assert lake.query("SELECT count(DISTINCT prompt_id) FROM candidates")[0, 0] == 8
        assert lake.query("SELECT count(*) FROM selections")[0, 0] == 8 * 2

        # pause: no run starts afterwards (one already running may finish)
        res = _thresher("schedule", "pause", "sched-test", env=env)
        assert res.returncode == 0, res.stderr
        assert "paused curate/sched-test" in res.stdout
        paused_at = datetime.now(UTC)
        before = {r["id"] for r in _runs(url, dep["id"])}
        time.sleep(15)  # three intervals
        runs = _runs(url, dep["id"])
        assert {r["id"] for r in runs} <= before, "the scheduler created runs after the pause"
        started = [r["name"] for r in runs if _ran_after(url, r["id"], paused_at)]
        assert not started, f"runs started after the pause: {started}"
        assert not [r for r in runs if r["state_type"] in ("SCHEDULED", "PENDING")]

        res = _thresher("schedule", "list", env=env)
        assert res.returncode == 0, res.stderr
        line = next(ln for ln in res.stdout.splitlines() if "curate/sched-test" in ln)
        assert "paused" in line and "every 5 s" in line

        # a value of the wrong type is refused by the server, without a traceback
        res = _thresher("trigger", "sched-test", "--param", "progress=maybe", env=env)
        assert res.returncode == 1 and "refused the run" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr

        # a triggered run still runs, in the serving process, with merged parameters
        trigger = ("trigger", "sched-test", "--param", "config.batch_size=4", "--wait")
        res = _thresher(*trigger, env=env, timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr + log_path.read_text()[-3000:]
        assert "completed" in res.stdout
        new = [r for r in _runs(url, dep["id"]) if r["id"] not in before]
        assert len(new) == 1 and not new[0]["auto_scheduled"]
        assert new[0]["state_type"] == "COMPLETED"
        config = new[0]["parameters"]["config"]
        assert config["batch_size"] == 4  # an int, from YAML
        assert {**config, "batch_size": 8} == dep["parameters"]["config"]
        assert lake.query("SELECT count(*) FROM candidates")[0, 0] == 8 * 2  # resumed
    finally:
        _stop(serve)
        log.close()
    res = _thresher("schedule", "delete", "sched-test", env=env)
    assert res.returncode == 0, res.stderr
    assert _deployment(url, "curate/sched-test") is None


def test_prefect_deploy_reads_prefect_yaml(prefect_server, prefect_env):
    url = prefect_server

    def prefect(*args):
        return run_module("prefect", *args, env=prefect_env, cwd=ROOT, timeout=180)

    res = prefect("work-pool", "create", "thresher", "--type", "process")
    assert res.returncode == 0, res.stdout + res.stderr
    res = prefect("--no-prompt", "deploy", "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
        for d in doc["deployments"]:
            flow = d["entrypoint"].split(":")[1].removesuffix("_flow")
            got = _deployment(url, f"{flow}/{d['name']}")
            assert got is not None, d["name"]
            assert got["paused"] and got["work_pool_name"] == "thresher"
            assert got["parameters"] == d["parameters"]
            assert got["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
        res = _thresher("schedule", "list", env=prefect_env)
        assert res.returncode == 0, res.stderr
        assert "curate/curate-demo" in res.stdout and "bootstrap/bootstrap-demo" in res.stdout
    finally:
        for full in ("curate/curate-demo", "bootstrap/bootstrap-demo"):
            _thresher("schedule", "delete", full, env=prefect_env)
