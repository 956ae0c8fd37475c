"""Lake commands: ingest prompts, query with SQL (also as of earlier versions), list the
tables and their history, compact, vacuum, migrate."""

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
from thresher.ingest.presets import help_lines


class SourceFormat(StrEnum):
    jsonl = "jsonl"
    json = "json"
    csv = "csv"
    parquet = "parquet"
    dataset = "dataset"


def _ingest_help() -> str:
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
        "\n\n"
        "--from reasoning-gym generates prompts instead of reading a file: PATH is "
        "TASK[,TASK...] (reasoning-gym's generator names) or a YAML file (tasks: {NAME: "
        "{weight, config}}, size, seed, mixture, instruction). Each entry keeps its generator, "
        "config, seed and the whole entry in meta, for the `reasoning_gym` verifier; the task "
        "column is the generator's name. Example: thresher ingest --from reasoning-gym "
        "chain_sum,leg_counting --size 200 --seed 1 --set chain_sum.max_terms=3 -d rg"
    )


@app.command(help=_ingest_help())
def ingest(
    path: Annotated[
        Path,
        typer.Argument(
            help="JSONL, JSON, CSV or Parquet file, or a folder saved with datasets' "
            "save_to_disk; with --from: TASK[,TASK...] or a YAML file of tasks."
        ),
    ],
    dataset: Annotated[
        str, typer.Option("--dataset", "-d", help="Dataset name for these prompts.")
    ],
    split: Annotated[
        Split,
        typer.Option(
            help="train prompts feed training; eval prompts are held out and decide rounds; "
            "test prompts are sealed (read only by `thresher eval --split test --final`)."
        ),
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
    env: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Generate prompts with an environment instead: reasoning-gym.",
            show_default=False,
        ),
    ] = None,
    size: Annotated[
        int | None,
        typer.Option(min=1, help="With --from: entries per task (a mixture: in all) [100]."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="With --from: the generators' seed [0].")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="With --from: task.key=value, a generator setting (e.g. "
            "chain_sum.max_terms=3). Repeatable.",
        ),
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Load prompts into the lake (see the command's help text)."""
    from thresher.ingest.load import IngestError, parse_mapping  # local: fast --help
    from thresher.ingest.load import ingest as do_ingest
    from thresher.stores.lake import Lake

    generated = (size, seed, set_)
    if env is None and any(v is not None for v in generated):
        fail("--size, --seed and --set go with --from (a generated source)", code=2)
    if env is not None and (map_ or task or fmt or preset):
        fail("--from generates its own prompt fields: drop --map, --task, --format, --preset", 2)
    try:
        if env is not None:
            from thresher.ingest.envs import ingest_env, parse_spec

            spec = parse_spec(str(path), size, seed, set_)
            report = ingest_env(Lake(lake), env, spec, dataset, split.value)
        else:
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


AS_OF_HELP = (
    "Query the lake as it was: a time (2026-12-01T14:00, UTC unless it has an offset), "
    "TABLE=VERSION[,TABLE=VERSION] (see `thresher history`; other tables at their latest), "
    "or run:RUN_ID (the versions that run read, e.g. the data a model was trained on)."
)


@app.command()
def sql(
    query: Annotated[
        str, typer.Argument(help='One read-only statement, e.g. "SELECT * FROM yield_by_round".')
    ],
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    max_rows: Annotated[int, typer.Option(help="Rows shown in table format.")] = 50,
    as_of: Annotated[str | None, typer.Option("--as-of", help=AS_OF_HELP)] = None,
    lake: LakeOption = None,
) -> None:
    """Run read-only SQL over the lake (safe while flows are writing).

    Tables: prompts, rejects, runs, candidates, verdicts, selections, evals,
    train_metrics. Views: current_selections, candidate_outcomes, pass_rate, funnel,
    yield_by_round, round_funnel, prompt_difficulty, difficulty_by_round.
    Every query reads one snapshot: each table as of its latest commit when the query
    starts. Write statements (INSERT, CREATE, COPY, ...) are refused.
    """
    import duckdb

    from thresher.stores.delta import SnapshotGone  # local: fast --help
    from thresher.stores.lake import Lake
    from thresher.stores.maintenance import BadSnapshot, as_of_versions
    from thresher.stores.sql import QueryRefused, run_sql

    try:
        lk = Lake(lake, create=False)
        if as_of is not None:
            lk = Lake(lake, as_of=as_of_versions(lk, as_of))
        df = run_sql(lk, query)
    except QueryRefused as e:
        fail(str(e), code=2)
    except (FileNotFoundError, BadSnapshot, SnapshotGone) as e:
        fail(str(e))
    except duckdb.Error as e:
        fail(str(e).strip())
    print_frame(df, fmt, max_rows)


TableOption = Annotated[
    str | None, typer.Option("--table", "-t", help="Only this table (default: all).")
]


def _open_lake(lake: str | None):
    from thresher.stores.lake import Lake  # local: fast --help

    try:
        lk = Lake(lake, create=False)
        lk.check_readable()  # a clear error for a missing lake (main: for an older one)
    except FileNotFoundError as e:
        fail(str(e))
    return lk


@app.command()
def history(
    table: TableOption = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Commits per table.")] = 10,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    lake: LakeOption = None,
) -> None:
    """List each table's latest versions (commits): when, what, rows added.

    Any listed version can be queried with `thresher sql --as-of TABLE=VERSION`.
    """
    import polars as pl

    from thresher.stores.maintenance import history as table_history  # local: fast --help

    lk = _open_lake(lake)
    try:
        rows = table_history(lk, table, limit)
    except ValueError as e:
        fail(str(e))
    print_frame(pl.DataFrame(rows), fmt, max_rows=len(rows))


@app.command()
def compact(
    table: TableOption = None,
    target_mb: Annotated[int, typer.Option(help="Size of the rewritten files, MiB.")] = 128,
    lake: LakeOption = None,
) -> None:
    """Rewrite many small files into few large ones (one commit per table).

    Appends write one file per batch; queries get slower as files pile up. Compaction
    changes no query result, and earlier versions stay readable until `thresher vacuum`.
    Curate and bootstrap runs compact on their own past `compact.after_small_files`.
    """
    from thresher.stores.maintenance import compact as compact_tables  # local: fast --help

    lk = _open_lake(lake)
    try:
        done = compact_tables(lk, table, target_mb)
    except ValueError as e:
        fail(str(e))
    for name, m in done.items():
        typer.echo(f"{name:<14} {m['files_before']:>7} files -> {m['files_after']}")


@app.command()
def vacuum(
    retain: Annotated[
        float, typer.Option(help="Keep every file a version of the last RETAIN hours needs.")
    ] = 168,
    table: TableOption = None,
    force: Annotated[
        bool, typer.Option(help="Allow --retain under 1 hour (nothing may be reading).")
    ] = False,
    lake: LakeOption = None,
) -> None:
    """Delete files no recent version needs: those replaced by compaction more than
    --retain hours ago, and those of writers killed before their commit.

    Versions older than --retain may no longer be readable with `sql --as-of` afterwards.
    """
    from thresher.stores.maintenance import vacuum as vacuum_tables  # local: fast --help

    lk = _open_lake(lake)
    try:
        done = vacuum_tables(lk, retain, table, force)
    except ValueError as e:
        fail(str(e), code=2)
    for name, n in done.items():
        typer.echo(f"{name:<14} {n:>7} files deleted")


@app.command()
def migrate(lake: LakeOption = None) -> None:
    """Convert a lake written by an older thresher (plain Parquet folders) into Delta
    tables, without losing or doubling a row; run it again if it was interrupted."""
    from thresher.stores.lake import Lake  # local: fast --help
    from thresher.stores.maintenance import migrate as migrate_lake

    lk = Lake(lake, create=False)
    if not lk.exists():
        fail(f"no lake at {lk.root}")
    if not lk.legacy():
        typer.echo(f"{lk.location}: every table is a Delta table already")
        return
    for name, rows in migrate_lake(lk.root).items():
        typer.echo(f"{name:<14} {rows:>9} rows -> Delta table")


@app.command()
def tables(lake: LakeOption = None) -> None:
    """List the lake's tables and views with their row counts."""
    from thresher.stores.lake import DERIVED_VIEWS, Lake  # local: fast --help
    from thresher.stores.schemas import TABLES

    lk = Lake(lake, create=False)
    try:
        views = ("run_updates", *DERIVED_VIEWS)  # run_updates: every status row of `runs`
        counts = {name: lk.count(name) for name in (*TABLES, *views)}
    except FileNotFoundError as e:
        fail(str(e))
    typer.echo(f"lake: {lk.location}")
    for name, n in counts.items():
        kind = "view " if name in views else "table"
        typer.echo(f"  {kind} {name:<20} {n:>10} rows")
