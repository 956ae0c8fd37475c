"""One device, many stages: a Prefect global concurrency limit around the work that needs
the accelerator (a local vLLM engine, reward-model scoring, training).

Scheduled runs then queue for the device instead of fighting over its memory. The limit
is named `gpu` (THRESHER_GPU_LIMIT) with THRESHER_GPU_SLOTS slots (default 1), created on
first use. A local vLLM engine holds its slot for as long as it lives, since it keeps
the device's memory between batches. Slots are re-entrant per thread: a reward model
scored while this thread's engine holds the slot does not wait for itself. Only with a
Prefect server (PREFECT_API_URL): that is where scheduled runs share a device.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

_local = threading.local()
# A killed process cannot release its slot; the server frees it when the lease runs out.
# Short leases (renewed in the background while held) keep a crash from blocking the
# device for long.
LEASE_S = 60.0  # the server's minimum
_created: dict[str, int] = {}  # limit name -> its slots
_engine_slot: dict[str, ExitStack | None] = {"stack": None}


def shared_server() -> bool:
    """Whether a Prefect server outlives this process (PREFECT_API_URL is set).

    The temporary server of a command without one does not expire the leases of killed
    processes, so a crash would hold the slot for good: without a server, no limit."""
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())


def limit_name() -> str:
    """The global concurrency limit's name."""
    return os.environ.get("THRESHER_GPU_LIMIT", "gpu")


def ensure_limit(name: str | None = None, slots: int | None = None) -> str:
    """Create the limit on the Prefect server unless it exists; returns its name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = name or limit_name()
    if name in _created:
        return name
    slots = slots or int(os.environ.get("THRESHER_GPU_SLOTS", "1"))
    with get_client(sync_client=True) as client:
        try:
            slots = client.read_global_concurrency_limit_by_name(name).limit
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=slots)
                )
            except ObjectAlreadyExists:
                pass  # another process created it first
    _created[name] = slots
    return name


@contextmanager
def gpu_slot(stage: str = "", occupy: int = 1) -> Iterator[None]:
    """Hold `occupy` slots of the device limit (at most all of them) while the body runs
    (re-entrant per thread)."""
    depth = getattr(_local, "depth", 0)
    if not depth and not shared_server():
        yield  # no server that outlives this process: nothing to share the device with
        return
    if depth:
        _local.depth = depth + 1
        try:
            yield
        finally:
            _local.depth -= 1
        return
    import sys

    from prefect.concurrency.sync import concurrency

    name = ensure_limit()
    occupy = max(1, min(occupy, _created[name]))
    with ExitStack() as stack:
        try:
            stack.enter_context(
                concurrency(
                    name, occupy=occupy, strict=True, timeout_seconds=2, lease_duration=LEASE_S
                )
            )
        except TimeoutError:
            print(
                f"{stage or 'stage'}: waiting for a free '{name}' slot, held by another run "
                f"(prefect gcl inspect {name})",
                file=sys.stderr,
                flush=True,
            )
            stack.enter_context(
                concurrency(name, occupy=occupy, strict=True, lease_duration=LEASE_S)
            )
        _local.depth = 1
        try:
            yield
        finally:
            _local.depth = 0


def hold_for_engine() -> None:
    """Take a slot for this process's engine (no-op if it holds one already)."""
    if _engine_slot["stack"] is not None:
        return
    stack = ExitStack()
    stack.enter_context(gpu_slot("engine"))
    _engine_slot["stack"] = stack


def release_engine_slot() -> None:
    """Give back the engine's slot (after the engine is shut down)."""
    stack, _engine_slot["stack"] = _engine_slot["stack"], None
    if stack is not None:
        stack.close()
