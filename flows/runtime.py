"""Prefect settings for the flow runs thresher starts in this process."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from thresher.flows.slots import release_engine_slot
from thresher.samplers.engines import shutdown

if TYPE_CHECKING:
    from prefect import Flow
    from pydantic import BaseModel

F = TypeVar("F", bound=Callable[..., Any])

# (settings in force, the quiet copy of them): building a copy costs ~30 ms
_QUIET: list[tuple[Any, Any]] = []


@contextmanager
def flow_settings() -> Iterator[None]:
    """Without a Prefect server (PREFECT_API_URL unset) flows run on a temporary server
    that dies with the process: nobody can look at what it records. There, the work
    that only feeds a server's UI is turned off, because it runs on the cores the engine
    samples on: flow-run heartbeats (they let a server mark crashed runs; ~1 s at the end
    of every flow run), shipping logs to the API, and the server's processing of every
    task's events (recording task runs, persisting events, automations, streaming them
    out) and its telemetry; measured, they slowed the sampling stage by about 3 %. With
    a server, Prefect's settings apply unchanged: runs, task runs, logs and events are
    all recorded."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        yield
        return
    context = prefect.context.get_settings_context()
    quiet = next((q for base, q in _QUIET if base is context.settings), None)
    if quiet is None:
        quiet = context.settings.copy_with_update(updates=_quiet_updates())
        _QUIET[:] = [(context.settings, quiet)]
    with prefect.context.SettingsContext(profile=context.profile, settings=quiet):
        yield


def _quiet_updates() -> dict:
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOGGING_TO_API_ENABLED,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED,
        PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED,
        PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED,
    )

    return {
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
        PREFECT_LOGGING_TO_API_ENABLED: False,
        # read by the temporary server when it starts (its environment is these settings)
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED: False,
        PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED: False,
        PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED: False,
        PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED: False,
        PREFECT_SERVER_ANALYTICS_ENABLED: False,  # its telemetry service
    }


def resolved(fn: F) -> F:
    """`fn` with its annotations resolved to the classes they name. Under postponed
    annotations they are strings, which Prefect resolves against the module when a flow
    runs in this process; a served run gets the flow pickled, and its parameter model
    comes back with strings nothing resolves. Put it under `@flow`."""
    fn.__annotations__ = typing.get_type_hints(fn)
    return fn


def run_name(kind: str) -> str:
    """The Prefect name of a `kind` run from its config: kind, pipeline, dataset and round."""
    from prefect.runtime import flow_run

    c = flow_run.parameters.get("config") or {}
    if not isinstance(c, dict):
        c = c.model_dump(include={"name", "prompts", "round"})
    dataset = (c.get("prompts") or {}).get("dataset", "?")
    return f"{kind} {c.get('name', '?')} {dataset} round {c.get('round', 0)}"


@contextmanager
def deployment_cleanup() -> Iterator[None]:
    """A deployment's run (scheduled, triggered, served or on a worker) stops its engine
    when it ends, giving the device slot back; `thresher` commands do it themselves,
    and a subflow leaves the engine to its parent (bootstrap reuses it)."""
    try:
        yield
    finally:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        if run is not None and run.deployment_id and run.parent_task_run_id is None:
            stop_engine()


def stop_engine() -> None:
    """Shut the process's engine (or Ray engine pool) down and give its device slot back."""
    try:
        shutdown()
    finally:
        release_engine_slot()


def quiet_task_logs(flows: bool = False) -> None:
    """One INFO line per task (and, with `flows`, per subflow) would bury the progress
    bars; keep their warnings and errors."""
    import logging

    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    if flows:
        logging.getLogger("prefect.flow_runs").setLevel(logging.WARNING)


def run_in_process(
    flow: Flow[..., BaseModel],
    cfg: BaseModel,
    lake_root: str | Path,
    progress: bool,
    subflows: bool = False,
) -> dict[str, Any]:
    """Run `flow` for a validated config from a `thresher` command, then stop the engine
    it started; returns the run's summary as recorded."""
    quiet_task_logs(flows=subflows)
    try:
        with flow_settings():
            return flow(cfg, str(lake_root), progress).model_dump(exclude_unset=True)
    finally:
        stop_engine()
