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
    rl = "rl"


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
            help="sft: prompt + kept answer; dpo: prompt, chosen (kept), rejected (failed); "
            "rl: the training prompts a model solves between --min-pass and --max-pass of "
            "the time, for an RL trainer (verl parquet + a TRL GRPO dataset).",
        ),
    ] = ExportFormat.sft,
    model: Annotated[
        str | None,
        typer.Option(help="With --format rl: whose pass rates (default: the latest model)."),
    ] = None,
    min_pass: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="With --format rl: lowest pass rate kept.")
    ] = 0.2,
    max_pass: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="With --format rl: highest pass rate kept.")
    ] = 0.8,
    license_: Annotated[
        str | None,
        typer.Option(
            "--license",
            help="The data's licence for the card (SPDX id, e.g. mit), where its sources' "
            "licences are not known to thresher.",
        ),
    ] = None,
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            help="Also push the export to this Hub dataset repo (user/name) through "
            "`datasets`, with its card; needs a Hub login.",
        ),
    ] = None,
    private: Annotated[bool, typer.Option(help="With --push-to-hub: a private repo.")] = False,
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
    held-out pass@1 (a regressed later round is never it).

    With --format rl, no round: the training prompts whose pass rate under --model (pooled
    over its rounds' samples and evaluations, view `prompt_pass_rates`) lies in the band,
    less any overlapping an eval or test prompt, as train.parquet (verl: data_source,
    prompt, ability, reward_model, extra_info) and trl/ (a datasets dataset whose columns
    thresher's reward function reads: thresher.verifiers.rewards).

    Every export writes README.md, a dataset card: the Hub's YAML header, and what made the
    data (sources and licences, model and weights hash, sampling, verifiers, selection,
    decontamination, funnel, thresher's version, the SQL that lists the rows)."""
    from thresher.flows.handoff import export_data, export_rl  # local: fast --help
    from thresher.stores.export import ExportError
    from thresher.stores.lake import Lake

    if to.exists() and any(to.iterdir()):
        fail(f"{to} exists and is not empty")
    if best:
        _export_best(Lake(lake, create=False), name, to)
        return
    if min_pass > max_pass:
        fail(f"--min-pass {min_pass} is above --max-pass {max_pass}", code=2)
    if fmt is ExportFormat.rl:
        if round_ is not None:
            fail("--format rl exports prompts by pass rate, not a round: drop --round", code=2)
        try:
            got = export_rl(Lake(lake, create=False), to, model, min_pass, max_pass, license_)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        typer.echo(
            f"wrote {got['rows']} prompts of {got['model']} with pass rates in "
            f"[{min_pass}, {max_pass}] to {got['verl']} (verl) and {got['trl']} (TRL)"
            + (f"; {got['contaminated']} left out as eval overlaps" if got["contaminated"] else "")
        )
    else:
        if round_ is None:
            fail("give --round R (a round's kept data) or --best (the best model)", code=2)
        try:
            n = export_data(
                Lake(lake, create=False), round_, fmt.value, to, all_rounds, name, license_
            )
        except (ExportError, FileNotFoundError) as e:
            fail(str(e))
        typer.echo(f"wrote {n} {fmt.value} rows to {to} (and {to / 'data.jsonl'})")
    typer.echo(f"dataset card: {to / 'README.md'}")
    if push_to_hub:
        from thresher.flows.handoff import push_to_hub as push

        try:
            url = push(to, push_to_hub, fmt.value, private)
        except Exception as e:  # the Hub's own errors: no login, no network, no such repo
            fail(f"push to {push_to_hub} failed: {e}")
        typer.echo(f"pushed to {url}")


def _export_best(lake, name: str | None, to: Path) -> None:
    """Copy the best model of bootstrap `name` to `to`."""
    import shutil

    from thresher.stores.models import read_best_pointer  # local: fast --help

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

    from thresher.evaluators.page import PLOTS, write_report  # local: fast --help
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
