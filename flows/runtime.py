"""Prefect settings for the flow runs thresher starts in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
