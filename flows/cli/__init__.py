"""The `thresher` CLI, one module a theme: lake, pipelines, audit, results, schedules, tools."""

# Heavy libraries, and thresher's modules beyond the CLI, are imported inside the commands
# that need them (`# local: fast --help`), so `thresher --help` stays fast.

from __future__ import annotations

import signal
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import polars as pl

app = typer.Typer(
    name="thresher",
    help=(
        "thresher: a data engine for self-improving language models.\n\n"
        "Ingest prompts, sample k candidates per prompt with vLLM, verify them, keep the "
        "survivors, and inspect every table of the lake with SQL."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


LakeOption = Annotated[
    str | None,
    typer.Option(
        "--lake",
        envvar="THRESHER_LAKE",
        help="Lake folder, or an object-store URL such as s3://bucket/prefix (models and reports "
        "of a remote lake go under ./). Default: $THRESHER_LAKE, else the config's `lake`, "
        "else ./lake.",
        show_default=False,
    ),
]

ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor",
        help="Where sampling and verification run: local (one engine in this process) or "
        "ray (engines and verifiers on a Ray cluster: the config's ray.address, else "
        "$RAY_ADDRESS, else the cluster last started here with `ray start`, else a Ray "
        "instance for this run). Default: the config's executor.",
        show_default=False,
    ),
]


def fail(message: str, code: int = 1) -> None:
    """Print an error without a traceback and exit."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


class Split(StrEnum):
    train = "train"
    eval = "eval"
    test = "test"  # sealed: only `thresher eval --split test --final` reads it


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def print_frame(df: pl.DataFrame, fmt: OutputFormat, max_rows: int = 50) -> None:
    """Print a polars DataFrame as a table, CSV or JSON (one array of objects)."""
    import polars as pl

    if fmt is OutputFormat.csv:
        sys.stdout.write(df.write_csv())
    elif fmt is OutputFormat.json:
        sys.stdout.write(df.write_json() + "\n")
    else:
        with pl.Config(
            tbl_rows=max_rows,
            tbl_cols=-1,
            fmt_str_lengths=60,
            tbl_hide_dataframe_shape=True,
            tbl_hide_column_data_types=True,
            tbl_width_chars=200,
        ):
            typer.echo(df)
        more = df.height - max_rows
        typer.echo(f"{df.height} rows" + (f" ({more} not shown; --max-rows)" if more > 0 else ""))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    """Entry point of the `thresher` console script."""
    # SIGTERM (kill, timeout, a scheduler) would end the process without its exit hooks,
    # leaving the temporary Prefect server and the engine's processes running: exit instead
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app()
    except RuntimeError as e:
        if type(e).__name__ != "LegacyLake":  # a lake to migrate: say so, no traceback
            raise
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


# the commands register themselves with `app`, in the order `--help` lists them
from thresher.flows.cli import audit, lake, pipelines, results, schedules, tools  # noqa: E402, F401
