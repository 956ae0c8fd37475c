"""Scheduled and triggered runs: Prefect deployments of thresher's flows.

`thresher schedule FLOW` creates a deployment of a flow with a schedule and serves it
(runs start as child processes of the serving command); `thresher trigger` starts a run
of a deployment now. Both need a long-lived Prefect server (`PREFECT_API_URL`): the
temporary server Prefect starts for a single flow run dies with the command.

Prefect is imported inside the functions, so the pure helpers (`parse_param`,
`apply_params`) and the command line's --help stay light.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from thresher.flows import FLOWS, config_model, flow_object  # noqa: F401
from thresher.flows.runtime import stop_engine

if TYPE_CHECKING:
    from uuid import UUID

    from prefect import Flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, FlowRun, State
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.schedules import Schedule

# --overlap: what a run that is due while another run of the deployment is active does
OVERLAP = {
    "skip": "CANCEL_NEW",  # cancelled (the next one after the active run finishes starts)
    "queue": "ENQUEUE",  # waits for the active run to finish
    "allow": None,  # runs beside it
}

NO_SERVER = (
    "no Prefect server configured: scheduled and triggered runs need a long-lived one.\n"
    "  start one (in another terminal):  prefect server start\n"
    "  and point thresher at it:         export PREFECT_API_URL=http://127.0.0.1:4200/api"
)


class ScheduleError(Exception):
    """A user-facing error: no server, unknown deployment, bad --param, ..."""


# ---------------------------------------------------------------- parameters


def parse_param(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value); the value is read as YAML
    (`4` -> 4, `0.5` -> 0.5, `true` -> True, `[1, 4]` -> [1, 4], `abc` -> "abc")."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScheduleError(f"--param {text!r}: expected KEY=VALUE (e.g. config.max_rounds=4)")
    path = key.split(".")
    if any(not part for part in path):
        raise ScheduleError(f"--param {text!r}: empty key in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ScheduleError(f"--param {text!r}: value is not valid YAML: {e}") from None
    return path, value


def apply_params(
    parameters: dict[str, Any], params: list[str], known: set[str] | None = None
) -> dict[str, Any]:
    """A deep copy of `parameters` with each `KEY=VALUE` of `params` set; dotted keys go
    into nested dicts (`config.sampling.k=4`), creating missing levels. `known`: the
    flow's top-level parameter names (a first key outside it is an error)."""
    out = copy.deepcopy(parameters)
    names = set(known or ()) | set(out)
    for text in params:
        path, value = parse_param(text)
        if known is not None and path[0] not in names:
            hint = (
                f"; config keys need `config.` in front (config.{'.'.join(path)})"
                if "config" in names
                else ""
            )
            raise ScheduleError(
                f"--param {text!r}: unknown parameter {path[0]!r} "
                f"(parameters: {', '.join(sorted(names))}){hint}"
            )
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ScheduleError(
                    f"--param {text!r}: {where} is {type(child).__name__} {child!r}, not a mapping"
                )
            node = child
        node[path[-1]] = value
    return out


# ---------------------------------------------------------------- server


def require_server() -> str:
    """The configured PREFECT_API_URL, after checking that something answers there."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ScheduleError(NO_SERVER)
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=10)
    except httpx.HTTPError as e:
        raise ScheduleError(
            f"cannot reach the Prefect server at PREFECT_API_URL={url} "
            f"({type(e).__name__}: {e}).\n"
            "  start it with:  prefect server start\n"
            "  (or point PREFECT_API_URL at the server you use)"
        ) from None
    return url


def ui_url(path: str) -> str | None:
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base.rstrip('/')}/{path}" if base else None


# ---------------------------------------------------------------- serve


def describe_schedule(cron: str | None, interval: float | None, timezone: str | None) -> str:
    if cron:
        return f"cron {cron!r}" + (f" ({timezone})" if timezone else " (UTC)")
    return f"every {format_seconds(interval or 0)}"


def format_seconds(seconds: float) -> str:
    if seconds != int(seconds):
        return f"{seconds:g} s"
    seconds = int(seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds // n} {unit}"
    return f"{seconds} s"


def stop_engine_hook(flow: Flow[..., Any], flow_run: FlowRun, state: State) -> None:
    """After a served run: stop the run process's vLLM engine and give its device slot
    back (`thresher curate` does this after the flow; a served run is the flow alone)."""
    stop_engine()


def served_flow(kind: str) -> Flow[..., Any]:
    """The flow, plus hooks that stop its engine when a served run ends."""
    flow = flow_object(kind)
    return flow.with_options(
        on_completion=[*flow.on_completion_hooks, stop_engine_hook],
        on_failure=[*flow.on_failure_hooks, stop_engine_hook],
    )


def make_schedule(cron: str | None, interval: float | None, timezone: str | None) -> Schedule:
    """A validated Prefect schedule for --cron or --interval."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron, Interval
    from pydantic import ValidationError

    if (cron is None) == (interval is None):
        raise ScheduleError("give exactly one of --cron and --interval")
    try:
        if cron is not None:
            CronSchedule(cron=cron, timezone=timezone)  # validates the expression and zone
            return Cron(cron, timezone=timezone)
        if interval <= 0:
            raise ScheduleError("--interval must be a positive number of seconds")
        return Interval(interval, timezone=timezone)
    except ValidationError as e:
        msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise ScheduleError(f"invalid schedule: {msgs}") from None
    except ValueError as e:
        raise ScheduleError(f"invalid schedule: {e}") from None


def concurrency(overlap: str) -> ConcurrencyLimitConfig | None:
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    strategy = OVERLAP[overlap]
    if strategy is None:
        return None
    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy(strategy))


class Server:
    """A Prefect runner serving one deployment of a thresher flow: `register()` creates
    (or updates) the deployment, `run()` starts its runs until Ctrl-C / SIGTERM, then
    pauses its schedule."""

    def __init__(
        self,
        kind: str,
        parameters: dict[str, Any],
        name: str,
        cron: str | None = None,
        interval: float | None = None,
        timezone: str | None = None,
        overlap: str = "skip",
    ):
        from prefect.exceptions import InvalidNameError
        from prefect.flows import _raise_on_name_with_banned_characters

        try:
            _raise_on_name_with_banned_characters(name)
        except InvalidNameError as e:
            raise ScheduleError(f"--name {name!r}: {e}") from None
        self.kind, self.name, self.parameters = kind, name, parameters
        self.schedule = make_schedule(cron, interval, timezone)
        self.when = describe_schedule(cron, interval, timezone)
        self.limit = concurrency(overlap)
        self.flow = served_flow(kind)
        self.runner = None

    @property
    def full_name(self) -> str:
        return f"{self.flow.name}/{self.name}"

    def register(self):
        """Create or update the deployment; returns its id."""
        from prefect.deployments.runner import EntrypointType
        from prefect.runner import Runner

        self.runner = Runner(name=self.name, pause_on_shutdown=True)
        return self.runner.add_flow(
            self.flow,
            name=self.name,
            schedules=[self.schedule],
            concurrency_limit=self.limit,
            parameters=self.parameters,
            description=f"thresher {self.kind}: {self.when}",
            tags=["thresher"],
            # the deployment records an importable entrypoint (thresher.flows.<module>)
            entrypoint_type=EntrypointType.MODULE_PATH,
        )

    def run(self) -> None:
        """Serve until interrupted (what Flow.serve does after registering)."""
        import asyncio

        from prefect.exceptions import TerminationSignal

        try:
            asyncio.run(self.runner.start())
        except (KeyboardInterrupt, TerminationSignal):
            pass


# ---------------------------------------------------------------- deployments


@dataclass
class Found:
    deployment: Any  # DeploymentResponse
    flow_name: str

    @property
    def full_name(self) -> str:
        return f"{self.flow_name}/{self.deployment.name}"


def _flow_names(client, flow_ids) -> dict:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterId

    ids = list(set(flow_ids))
    if not ids:
        return {}
    flows = client.read_flows(flow_filter=FlowFilter(id=FlowFilterId(any_=ids)))
    return {f.id: f.name for f in flows}


def find_deployment(client: SyncPrefectClient, name: str) -> Found:
    """`flow/deployment`, or a bare deployment name that only one flow uses."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.exceptions import ObjectNotFound

    if "/" in name:
        try:
            dep = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise ScheduleError(f"no deployment {name!r} (see `thresher schedule list`)") from None
        return Found(dep, name.split("/", 1)[0])
    deps = client.read_deployments(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name]))
    )
    if not deps:
        raise ScheduleError(f"no deployment named {name!r} (see `thresher schedule list`)")
    names = _flow_names(client, [d.flow_id for d in deps])
    if len(deps) > 1:
        full = ", ".join(sorted(f"{names.get(d.flow_id, '?')}/{d.name}" for d in deps))
        raise ScheduleError(f"{name!r} is ambiguous: {full}; give FLOW/NAME")
    return Found(deps[0], names.get(deps[0].flow_id, "?"))


def _client():
    from prefect import get_client

    return get_client(sync_client=True)


def _runs(client, deployment_id, states=None, sort=None, limit=None):
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    run_filter = (
        FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states)))
        if states
        else None
    )
    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=run_filter,
        sort=sort,
        limit=limit,
    )


def schedule_text(dep: DeploymentResponse) -> str:
    parts = []
    for s in dep.schedules:
        sch = s.schedule
        if getattr(sch, "interval", None) is not None:
            text = f"every {format_seconds(sch.interval.total_seconds())}"
        elif getattr(sch, "cron", None):
            text = f"cron {sch.cron}" + (f" {sch.timezone}" if sch.timezone else "")
        elif getattr(sch, "rrule", None):
            text = f"rrule {sch.rrule}"
        else:
            text = "?"
        parts.append(text + ("" if s.active else " (inactive)"))
    return "; ".join(parts) or "-"


def _when(dt) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S") if dt else "-"


def list_deployments() -> list[dict[str, str]]:
    """One row per deployment on the server: name, schedule, status, next and last run
    (the last one that ran: runs cancelled before they started are left out)."""
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    ran = [StateType.RUNNING, StateType.COMPLETED, StateType.FAILED, StateType.CRASHED]

    rows = []
    with _client() as client:
        deps = client.read_deployments()
        names = _flow_names(client, [d.flow_id for d in deps])
        for dep in sorted(deps, key=lambda d: (names.get(d.flow_id, ""), d.name)):
            upcoming = _runs(
                client,
                dep.id,
                [StateType.SCHEDULED],
                FlowRunSort.NEXT_SCHEDULED_START_TIME_ASC,
                1,
            )
            last = _runs(client, dep.id, ran, FlowRunSort.START_TIME_DESC, 1)
            status = getattr(dep.status, "value", dep.status) or "?"
            rows.append(
                {
                    "deployment": f"{names.get(dep.flow_id, '?')}/{dep.name}",
                    "schedule": schedule_text(dep),
                    "state": "paused" if dep.paused else "active",
                    "runner": "ready" if str(status).upper() == "READY" else "not ready",
                    "next run (UTC)": (
                        _when(upcoming[0].next_scheduled_start_time)
                        if upcoming and not dep.paused
                        else "-"
                    ),
                    "last run (UTC)": (
                        f"{_when(last[0].start_time)} {last[0].state_name}" if last else "-"
                    ),
                }
            )
    return rows


def cancel_pending(client: SyncPrefectClient, deployment_id: UUID, message: str) -> int:
    """Cancel the deployment's scheduler-created runs that have not started: Scheduled
    (including Late) and Pending (a runner picked it up ahead of its start time).
    Pausing alone deletes only future Scheduled runs."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    n = 0
    for run in _runs(client, deployment_id, [StateType.SCHEDULED, StateType.PENDING]):
        if run.auto_scheduled:
            client.set_flow_run_state(run.id, Cancelling(message=message))
            n += 1
    return n


def pause(name: str) -> tuple[str, int]:
    """Pause the schedule and cancel its runs that have not started; returns
    (flow/deployment, runs cancelled)."""
    with _client() as client:
        found = find_deployment(client, name)
        client.pause_deployment(found.deployment.id)
        cancelled = cancel_pending(
            client, found.deployment.id, "deployment paused (thresher schedule pause)"
        )
    return found.full_name, cancelled


def resume(name: str) -> str:
    with _client() as client:
        found = find_deployment(client, name)
        client.resume_deployment(found.deployment.id)
    return found.full_name


def delete(name: str) -> str:
    with _client() as client:
        found = find_deployment(client, name)
        client.delete_deployment(found.deployment.id)
    return found.full_name


# ---------------------------------------------------------------- trigger


def trigger(name: str, params: list[str]) -> tuple[Found, Any]:
    """Start a run of the deployment now with `params` merged onto its parameters;
    returns (deployment, flow run) without waiting."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectHTTPStatusError

    with _client() as client:
        found = find_deployment(client, name)
    dep = found.deployment
    schema = dep.parameter_openapi_schema or {}
    known = set(schema.get("properties") or {}) or None
    parameters = apply_params(dep.parameters or {}, params, known)
    try:
        run = run_deployment(dep.id, parameters=parameters, timeout=0, as_subflow=False)
    except PrefectHTTPStatusError as e:  # e.g. a value of the wrong type for a parameter
        raise ScheduleError(f"the Prefect server refused the run: {refusal(e)}") from None
    return found, run


def refusal(e: PrefectHTTPStatusError) -> str:
    """The `detail` of a Prefect API error response, else the error."""
    try:
        return str(e.response.json()["detail"])
    except Exception:
        return str(e)


def wait_for(
    run_id: UUID, poll_s: float = 2.0, on_state: Callable[[FlowRun], None] | None = None
) -> FlowRun:
    """Poll a flow run until it reaches a final state; returns the run."""
    with _client() as client:
        seen = None
        while True:
            run = client.read_flow_run(run_id)
            if on_state and run.state_name != seen:
                seen = run.state_name
                on_state(run)
            if run.state is not None and run.state.is_final():
                return run
            time.sleep(poll_s)
