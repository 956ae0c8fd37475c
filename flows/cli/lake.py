"""Lake commands: ingest prompts, query with SQL, list the tables."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from thresher.flows.cli import (
    LakeOption,
    OutputFormat,
    Split,
    app,
    fail,
    print_frame,
)


class SourceFormat(StrEnum):
    jsonl = "jsonl"
    json = "json"
    csv = "csv"
    parquet = "parquet"
    dataset = "dataset"


def _ingest_help() -> str:
    from thresher.stores.presets import help_lines

    lines = "\n".join(f"- {line}" for line in help_lines())
    return (
        "Load prompts into the lake. Bad rows are kept in `rejects` with a reason.\n\n"
        "Each row needs a prompt (or chat `messages`) and a task. Ingesting the same rows "
        "again adds nothing: prompt ids are content hashes. Exits non-zero only when no "
        "valid row was read.\n\n"
        "--preset NAME reads a known dataset in its own columns (other columns go to meta; "
        "--map and --task still win):\n\n"
        f"{lines}\n\n"
        "MBPP prompts alone do not name the function, so its first test is appended to the "
        "prompt (as MBPP harnesses do). APPS/TACO problems whose function is a method of a "
        "class (LeetCode's `class Solution`) are rejected: their tests need the code "
        "verifier's isolation: shared. Aliases: Hub ids (openai/gsm8k, deepmind/code_contests, "
        "BAAI/TACO ...), human-eval, competition_math, math-500, mbpp-sanitized, code_contests."
    )


@app.command(help=_ingest_help())
def ingest(
    path: Annotated[
        Path,
        typer.Argument(
            help="JSONL, JSON, CSV or Parquet file, or a folder saved with datasets' save_to_disk."
        ),
    ],
    dataset: Annotated[
        str, typer.Option("--dataset", "-d", help="Dataset name for these prompts.")
    ],
    split: Annotated[
        Split, typer.Option(help="train prompts feed training; eval prompts are held out.")
    ] = Split.train,
    map_: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            "-m",
            help="field=column: read a field from another column "
            "(fields: prompt, messages, task, answer, tests, meta). Repeatable.",
        ),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Task name for rows without a task column (e.g. math, code).")
    ] = None,
    fmt: Annotated[
        SourceFormat | None,
        typer.Option("--format", help="Source format. Default: from the file name."),
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset",
            "-p",
            help="Read a known dataset's own columns: gsm8k, math, humaneval, mbpp, apps, "
            "codecontests, taco (see above).",
            show_default=False,
        ),
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Load prompts into the lake (see the command's help text)."""
    from thresher.stores.ingest import IngestError, parse_mapping
    from thresher.stores.ingest import ingest as do_ingest
    from thresher.stores.lake import Lake

    try:
        mapping = parse_mapping(map_ or [])
        report = do_ingest(
            Lake(lake),
            path,
            dataset,
            split.value,
            mapping,
            task,
            fmt.value if fmt else None,
            preset,
        )
    except IngestError as e:
        fail(str(e))
    typer.echo(
        f"{report.source}: read {report.read} rows: {report.ingested} ingested, "
        f"{report.already_present} already present, {report.rejected} rejected"
    )
    for reason, n in report.reasons.most_common():
        typer.echo(f"  rejected {n:>6}  {reason}")
    for hint, n in report.hints.most_common():
        typer.echo(f"  hint ({n} rows): {hint}")
    if report.rejected:
        typer.echo(
            '  see them with: thresher sql "SELECT line, reason, raw FROM rejects '
            f"WHERE source = '{report.source}' ORDER BY line\""
        )
    if report.valid == 0:
        fail("no valid rows were read", code=1)


@app.command()
def sql(
    query: Annotated[
        str, typer.Argument(help='One read-only statement, e.g. "SELECT * FROM yield_by_round".')
    ],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    max_rows: Annotated[int, typer.Option(help="Rows shown in table format.")] = 50,
    lake: LakeOption = None,
) -> None:
    """Run read-only SQL over the lake (safe while flows are writing).

    Tables: prompts, rejects, runs, candidates, verdicts, selections, evals.
    Views: candidate_outcomes, pass_rate, funnel, yield_by_round, round_funnel,
    prompt_difficulty, difficulty_by_round.
    Write statements (INSERT, CREATE, COPY, ...) are refused.
    """
    import duckdb

    from thresher.stores.lake import Lake
    from thresher.stores.sql import QueryRefused, run_sql

    try:
        df = run_sql(Lake(lake, create=False), query)
    except QueryRefused as e:
        fail(str(e), code=2)
    except FileNotFoundError as e:
        fail(str(e))
    except duckdb.Error as e:
        fail(str(e).strip())
    print_frame(df, fmt, max_rows)


@app.command()
def tables(lake: LakeOption = None) -> None:
    """List the lake's tables and views with their row counts."""
    from thresher.stores.lake import DERIVED_VIEWS, Lake
    from thresher.stores.schemas import TABLES

    lk = Lake(lake, create=False)
    try:
        counts = {name: lk.count(name) for name in (*TABLES, *DERIVED_VIEWS)}
    except FileNotFoundError as e:
        fail(str(e))
    typer.echo(f"lake: {lk.location}")
    for name, n in counts.items():
        kind = "view " if name in DERIVED_VIEWS else "table"
        typer.echo(f"  {kind} {name:<20} {n:>10} rows")
