"""Result commands: export a round's data, report the rounds."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from thresher.flows.cli import (
    LakeOption,
    OutputFormat,
    app,
    fail,
    print_frame,
)


class ExportFormat(StrEnum):
    sft = "sft"
    dpo = "dpo"


@app.command()
def export(
    round_: Annotated[
        int | None, typer.Option("--round", "-r", help="Round to export (its kept data).")
    ] = None,
    to: Annotated[
        Path,
        typer.Option(
            "--to",
            help="Folder to write: the data (datasets save_to_disk, plus data.jsonl), or "
            "with --best the model.",
        ),
    ] = ...,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            "-f",
            help="sft: prompt + kept answer; dpo: prompt, chosen (kept), rejected (failed).",
        ),
    ] = ExportFormat.sft,
    all_rounds: Annotated[
        bool, typer.Option(help="Rounds 0..R together (as STaR trains on).")
    ] = False,
    name: Annotated[
        str | None,
        typer.Option(help="Only this curate pipeline's data (default: every pipeline's)."),
    ] = None,
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="Export the bootstrap's best model (on the held-out metric) of pipeline "
            "--name instead of data: a copy of its folder.",
        ),
    ] = False,
    lake: LakeOption = None,
) -> None:
    """Export a round's selected data for training (load it with datasets.load_from_disk),
    or with --best the best model of a bootstrap.

    A round's data is its current selection: the one the pipeline's latest curate run of
    that round wrote (earlier selections stay in `selections`). The best model is the one
    `<lake>/models/<name>/best.json` points at: the round whose model scored the highest
    held-out pass@1 (a regressed later round is never it)."""
    from thresher.stores.export import ExportError, export_round
    from thresher.stores.lake import Lake

    if to.exists() and any(to.iterdir()):
        fail(f"{to} exists and is not empty")
    if best:
        _export_best(Lake(lake, create=False), name, to)
        return
    if round_ is None:
        fail("give --round R (a round's kept data) or --best (the best model)", code=2)
    try:
        n = export_round(Lake(lake, create=False), round_, fmt.value, to, all_rounds, name)
    except (ExportError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(f"wrote {n} {fmt.value} rows to {to} (and {to / 'data.jsonl'})")


def _export_best(lake, name: str | None, to: Path) -> None:
    """Copy the best model of bootstrap `name` to `to`."""
    import shutil

    from thresher.flows.bootstrap import read_best_pointer

    if not name:
        fail("--best needs --name: the bootstrap pipeline whose best model to export", code=2)
    pointer = read_best_pointer(lake, name)
    if pointer is None:
        fail(f"no best model recorded for {name!r} in {lake.root} (run its bootstrap first)")
    source = Path(pointer["model"])
    if not source.is_dir():
        fail(f"the best model of {name} (round {pointer['round']}) is gone: {source}")
    shutil.copytree(source, to, dirs_exist_ok=True)
    typer.echo(f"best model of {name}: round {pointer['round']} ({source}), copied to {to}")


@app.command()
def report(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder to write index.html and the PNGs to.",
            show_default="<lake>/report, or ./report for a remote lake",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            help="Only this pipeline: curate and evaluate runs whose config `name` is NAME.",
        ),
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Report the self-bootstrap rounds: held-out pass@k and the data funnel per round.

    Prints one row per round (round r's pass@k is model r, the model that sampled round
    r's data) and writes a self-contained HTML page with plots: pass@k, the curation
    funnel, per-prompt pass rates and tokens per candidate.
    """
    import duckdb
    import polars.selectors as cs

    from thresher.evaluators.page import PLOTS, write_report
    from thresher.evaluators.report import round_table
    from thresher.stores.lake import Lake

    lk = Lake(lake, create=False)
    try:
        page = write_report(lk, out or lk.local_dir("report"), name)
        table = round_table(lk, name)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    except duckdb.Error as e:
        fail(str(e).strip())
    print_frame(table.with_columns(cs.float().round(4)), OutputFormat.table, max_rows=1000)
    typer.echo(f"wrote {page}")
    for plot in PLOTS:
        if (page.parent / plot).exists():
            typer.echo(f"      {page.parent / plot}")
