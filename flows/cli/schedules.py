"""Schedule commands: serve flows on a schedule, manage schedules, trigger runs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from thresher.flows.cli import (
    LakeOption,
    app,
    fail,
)

schedule_app = typer.Typer(
    name="schedule",
    help=(
        "Run a flow on a schedule through a Prefect server, and manage the schedules.\n\n"
        "`thresher schedule FLOW -c CONFIG --interval SECONDS` (or --cron) creates a "
        "deployment and serves it until Ctrl-C. Needs a running `prefect server start` and "
        "PREFECT_API_URL."
    ),
    no_args_is_help=True,
)
app.add_typer(schedule_app)


class Overlap(StrEnum):
    skip = "skip"
    queue = "queue"
    allow = "allow"


SCHEDULED_FLOWS = {
    "curate": "one curate round (configs/demo.yaml)",
    "bootstrap": "self-bootstrap rounds (configs/bootstrap-demo.yaml)",
    "train": "a training run (configs/train-demo.yaml)",
    "evaluate": "an evaluation (an EvalConfig YAML: model, prompts, n, ks, ...)",
}


def _load_flow_config(kind: str, path: Path):
    """Validate CONFIG with the flow's pydantic model (as the flow's own command does)."""
    from thresher.config import ConfigError, load_config  # local: fast --help
    from thresher.flows.schedule import config_model

    try:
        cfg = load_config(path, config_model(kind))
    except ConfigError as e:
        fail(str(e), code=2)
    model = getattr(cfg, "base_model", None) or cfg.model
    if not getattr(cfg, "server", None) and not Path(model).is_dir():
        fail(f"model folder {model!r} does not exist (models load from local folders)")
    if getattr(cfg, "lora", None) and not (Path(cfg.lora) / "adapter_config.json").is_file():
        fail(f"{cfg.lora!r} is not a LoRA adapter folder (no adapter_config.json)")
    return cfg


def _schedule_flow(
    kind: str,
    config: Path,
    cron: str | None,
    interval: float | None,
    timezone: str | None,
    name: str | None,
    overlap: Overlap,
    lake: str | None,
) -> None:
    if (cron is None) == (interval is None):
        fail("give exactly one of --cron EXPR and --interval SECONDS", code=2)
    cfg = _load_flow_config(kind, config)
    from thresher.flows import schedule as sch  # local: fast --help

    try:
        sch.require_server()
    except sch.ScheduleError as e:
        fail(str(e))
    from thresher.stores.lake import Lake

    lake_root = Lake(lake or cfg.lake).location
    name = name or cfg.name
    params = {"config": cfg.model_dump(), "lake_root": lake_root, "progress": False}
    try:
        server = sch.Server(kind, params, name, cron, interval, timezone, overlap.value)
        deployment_id = server.register()
    except sch.ScheduleError as e:
        fail(str(e), code=2)
    link = sch.ui_url(f"deployments/deployment/{deployment_id}")
    typer.echo(
        f"deployment {server.full_name} ({server.when}; overlapping runs: {overlap.value})\n"
        f"  flow {kind}, config {config} (name {cfg.name!r}), lake {lake_root}\n"
        f"  id {deployment_id}"
        + (f"\n  in the UI: {link}" if link else "")
        + "\nserving it: each run starts as a child process of this command, in this folder.\n"
        f"  stop serving:     Ctrl-C (this also pauses the schedule; run this command again "
        "to serve and resume it)\n"
        f"  pause / resume:   thresher schedule pause {name}  /  thresher schedule resume {name}\n"
        f"  run it now:       thresher trigger {name} [--param config.KEY=VALUE]\n"
        f"  remove it:        thresher schedule delete {name}"
    )
    try:
        server.run()
    finally:
        typer.echo(f"stopped serving {server.full_name}; its schedule is paused")


def _add_schedule_command(kind: str, what: str, hidden: bool = False, alias: str = "") -> None:
    @schedule_app.command(
        alias or kind,
        hidden=hidden,
        help=(
            f"Run {what} on a schedule: create a Prefect deployment of the `{kind}` flow "
            "and serve it until Ctrl-C.\n\n"
            "CONFIG is validated now and stored in the deployment (edit the YAML and run "
            "this again to change it). The deployment's parameters are the config, the "
            "lake's absolute path and progress=false. --overlap: what a run that falls due "
            "while another run of this deployment is active does (skip: it is cancelled; "
            "queue: it waits; allow: it runs alongside)."
        ),
    )
    def command(
        config: Annotated[Path, typer.Option("--config", "-c", help="The flow's YAML config.")],
        cron: Annotated[
            str | None,
            typer.Option(help='Cron expression, e.g. "0 3 * * *" (03:00 every day).'),
        ] = None,
        interval: Annotated[
            float | None, typer.Option(help="Seconds between runs, e.g. 3600.", min=1)
        ] = None,
        timezone: Annotated[
            str | None, typer.Option(help="IANA time zone of --cron (default UTC).")
        ] = None,
        name: Annotated[
            str | None,
            typer.Option("--name", "-n", help="Deployment name (default: the config's name)."),
        ] = None,
        overlap: Annotated[
            Overlap, typer.Option(help="A run due while one is active: skip, queue or allow.")
        ] = Overlap.skip,
        lake: LakeOption = None,
    ) -> None:
        _schedule_flow(kind, config, cron, interval, timezone, name, overlap, lake)


for _kind, _what in SCHEDULED_FLOWS.items():
    _add_schedule_command(_kind, _what)
_add_schedule_command("evaluate", SCHEDULED_FLOWS["evaluate"], hidden=True, alias="eval")


def _with_server():
    """The schedule module, once a Prefect server is known to answer."""
    from thresher.flows import schedule as sch  # local: fast --help

    try:
        sch.require_server()
    except sch.ScheduleError as e:
        fail(str(e))
    return sch


def _schedule_action(action: str, name: str):
    """`thresher.flows.schedule.<action>(name)` on the server; its errors without a traceback."""
    sch = _with_server()
    try:
        return getattr(sch, action)(name)
    except sch.ScheduleError as e:
        fail(str(e))


NameArg = Annotated[
    str, typer.Argument(help="Deployment name, or FLOW/NAME (see `thresher schedule list`).")
]


@schedule_app.command("list")
def schedule_list() -> None:
    """List deployments: schedule, paused or active, served or not, next and last run.

    RUNNER is `ready` while a `thresher schedule` process (or a worker) polls for the
    deployment's runs; without one, nothing runs.
    """
    sch = _with_server()
    rows = sch.list_deployments()
    if not rows:
        typer.echo("no deployments (create one with `thresher schedule FLOW -c CONFIG ...`)")
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    typer.echo("  ".join(c.upper().ljust(widths[c]) for c in cols).rstrip())
    for r in rows:
        typer.echo("  ".join(r[c].ljust(widths[c]) for c in cols).rstrip())


@schedule_app.command("pause")
def schedule_pause(name: NameArg) -> None:
    """Pause a deployment's schedule and cancel its scheduled runs that have not started.

    A run in progress finishes. `thresher trigger` still starts runs of a paused deployment.
    """
    full, cancelled = _schedule_action("pause", name)
    typer.echo(
        f"paused {full}"
        + (f"; cancelled {cancelled} scheduled run(s) that had not started" if cancelled else "")
        + f"\n  resume: thresher schedule resume {name}"
    )


@schedule_app.command("resume")
def schedule_resume(name: NameArg) -> None:
    """Resume a paused deployment's schedule (a runner must serve it: see `list`)."""
    full = _schedule_action("resume", name)
    typer.echo(f"resumed {full}")


@schedule_app.command("delete")
def schedule_delete(name: NameArg) -> None:
    """Delete a deployment and its scheduled runs (past runs stay on the server)."""
    full = _schedule_action("delete", name)
    typer.echo(f"deleted {full} (stop the `thresher schedule` process serving it, if any)")


@app.command()
def trigger(
    name: NameArg,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="KEY=VALUE onto the deployment's parameters (repeatable); dotted keys go "
            "into the config, e.g. config.max_rounds=4; values are YAML (4 is a number).",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Wait for the run to finish; exit non-zero unless it completes.")
    ] = False,
) -> None:
    """Start a run of a deployment now, through the Prefect server.

    A served deployment (`thresher schedule`) runs it in the serving process, a
    prefect.yaml deployment on a worker of its pool; a paused schedule does not stop it.
    """
    sch = _with_server()
    try:
        found, run = sch.trigger(name, param or [])
    except sch.ScheduleError as e:
        fail(str(e), code=2 if "--param" in str(e) else 1)
    typer.echo(f"started flow run {run.name} ({run.id}) of {found.full_name}")
    link = sch.ui_url(f"runs/flow-run/{run.id}")
    if link:
        typer.echo(f"  {link}")
    if not wait:
        return
    run = sch.wait_for(run.id, on_state=lambda r: typer.echo(f"  {r.state_name}"))
    if not run.state.is_completed():
        message = run.state.message or ""
        fail(f"flow run {run.name} ended {run.state_name}" + (f": {message}" if message else ""))
    typer.echo(f"flow run {run.name} completed")
