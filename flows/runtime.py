"""Prefect settings for the flow runs thresher starts in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def flow_settings() -> Iterator[None]:
    """Without a Prefect server (PREFECT_API_URL unset) flows run on a temporary server
    that dies with the process; there, flow-run heartbeats (which let a server mark
    crashed runs) detect nothing and cost ~1 s at the end of every flow run, so they are
    turned off. With a server, Prefect's settings apply unchanged."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
