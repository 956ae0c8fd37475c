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
    round_: Annotated[int, typer.Option("--round", "-r", help="Round to export.")],
    to: Annotated[
        Path, typer.Option("--to", help="Folder to write (datasets save_to_disk, plus data.jsonl).")
    ],
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
    lake: LakeOption = None,
) -> None:
    """Export a round's selected data for training (load it with datasets.load_from_disk).

    A round's data is its current selection: the one the pipeline's latest curate run of
    that round wrote (earlier selections stay in `selections`)."""
    from thresher.stores.export import ExportError, export_round
    from thresher.stores.lake import Lake

    if to.exists() and any(to.iterdir()):
        fail(f"{to} exists and is not empty")
    try:
        n = export_round(Lake(lake, create=False), round_, fmt.value, to, all_rounds, name)
    except (ExportError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(f"wrote {n} {fmt.value} rows to {to} (and {to / 'data.jsonl'})")


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
