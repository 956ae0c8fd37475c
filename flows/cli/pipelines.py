"""Pipeline commands: curate, eval, train, bootstrap."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from thresher.flows.cli import (
    ExecutorOption,
    LakeOption,
    OutputFormat,
    Split,
    app,
    fail,
    print_frame,
)

if TYPE_CHECKING:
    from thresher.config import EngineStage


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
    indices, a smaller one reads the first k (majority verdicts are judged again among
    all k). The summary says what was reused and why.
    """
    from thresher.config import ConfigError, load_config  # local: fast --help

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
    from thresher.flows.curate import run_curate
    from thresher.flows.gates import pipeline_gates
    from thresher.flows.tasks import NothingToCurate
    from thresher.stores.lake import Lake
    from thresher.verifiers.base import GateRefused

    lk = Lake(lake_root)
    try:
        pipeline_gates(lk, cfg)  # before the flow: a refusal is one line, no traceback
        summary = run_curate(cfg, lk.root, progress=progress)
    except (NothingToCurate, GateRefused) as e:
        fail(str(e))
    print_summary(summary)


def with_executor(cfg: EngineStage, executor: str | None) -> EngineStage:
    """The config with --executor applied (validated like the file)."""
    if executor is None:
        return cfg
    from pydantic import ValidationError

    try:
        fields = {f: getattr(cfg, f) for f in type(cfg).model_fields}
        return type(cfg)(**{**fields, "executor": executor})
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
        + (f", {s['truncated_dropped']} passing but cut" if s.get("truncated_dropped") else "")
        + (f", {s['contaminated']} contaminated" if s["contaminated"] else "")
        + (f", {s['too_easy']} from too-easy prompts" if s["too_easy"] else "")
        + ")\n  "
        + reuse_line(s)
    )


@app.command("eval")
def eval_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Local model folder.")],
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Dataset of the prompts.")],
    split: Annotated[
        Split,
        typer.Option(
            help="Held-out prompts by default; test, the sealed split, only with --final."
        ),
    ] = Split.eval,
    final: Annotated[
        bool,
        typer.Option(
            "--final",
            help="Open the sealed test split (a milestone: each opening is recorded as a run, "
            "and the report counts them).",
        ),
    ] = False,
    k: Annotated[
        list[int] | None, typer.Option("-k", help="pass@k to report (repeatable; default 1 and 8).")
    ] = None,
    n: Annotated[int, typer.Option(help="Samples per prompt (at least the largest k).")] = 8,
    name: Annotated[
        str,
        typer.Option(
            "--name",
            help="The name the evaluation is filed under: `thresher report --name` and "
            "`python -m thresher.evaluators.compare` find it by it (samples are shared "
            "with any evaluation that sampled the same way).",
        ),
    ] = "eval",
    verifier: Annotated[
        list[str] | None,
        typer.Option(
            "--verifier",
            "-v",
            help="Verifier(s) that decide a pass (default: math). Held-out metrics should "
            "check the reference (math, exact, choice, code, judge, reasoning_gym); majority, "
            "reward, format "
            "and regex alone draw a warning.",
        ),
    ] = None,
    temperature: float = 0.7,
    max_tokens: int = 512,
    stop: Annotated[
        list[str] | None,
        typer.Option(
            help="A string that ends an answer, kept in it (repeatable; e.g. '</answer>')."
        ),
    ] = None,
    tools: Annotated[
        bool,
        typer.Option(
            "--tools",
            help="Let the model run Python while it answers: a ```python block is run in the "
            "code verifier's sandbox and its output appended (sampling.tools' defaults).",
        ),
    ] = False,
    max_calls: Annotated[
        int | None, typer.Option(help="With --tools: code runs per candidate (default 4).")
    ] = None,
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

    from thresher.config import EvalConfig  # local: fast --help

    if max_calls is not None and not tools:
        fail("--max-calls needs --tools", code=2)
    tool_cfg = ({"max_calls": max_calls} if max_calls is not None else {}) if tools else None
    try:
        cfg = EvalConfig(
            name=name,
            model=model,
            round=round_,
            n=n,
            ks=k or [1, 8],
            prompts={"dataset": dataset, "split": split.value, "limit": limit},
            sampling={
                "k": 1,
                "temperature": temperature,
                "max_tokens": max_tokens,
                "stop": stop or [],
                "tools": tool_cfg,
            },
            engine={"dtype": dtype, "max_model_len": max_model_len},
            **({"verify": {"verifiers": verifier}} if verifier else {}),
            executor=executor or "local",
            final=final,
        )
    except (ValidationError, ValueError) as e:
        fail(str(e), code=2)
    if not Path(model).is_dir():
        fail(f"model folder {model!r} does not exist")
    try:
        cfg.verify.with_reference()
    except ValueError as e:  # measured, but not a truth: say so
        typer.echo(f"warning: {e}", err=True)
    from thresher.flows.evaluate import run_eval
    from thresher.flows.tasks import NothingToCurate
    from thresher.stores.lake import Lake

    try:
        s = run_eval(cfg, Lake(lake).root, progress=progress)
    except NothingToCurate as e:
        fail(str(e))
    if s.get("test_opening"):
        typer.echo(f"\nthe test split of {dataset} has now been opened {s['test_opening']} time(s)")
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
    from thresher.config import ConfigError, TrainConfig, load_config  # local: fast --help

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
    for m in s.get("mix") or []:
        typer.echo(
            f"  mix {m['source']}: {m['rows']} rows ({m['row_share']:.2%}; weight share "
            f"{m['share']:.2%}) of {m['available']}"
            + (f", {m['repeated']} repeated" if m["repeated"] else "")
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
    from thresher.config import BootstrapConfig, ConfigError, load_config  # local: fast --help

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
    from thresher.flows.gates import pipeline_gates
    from thresher.flows.tasks import NothingToCurate
    from thresher.stores.lake import Lake

    lk = Lake(lake or cfg.lake)
    try:
        pipeline_gates(lk, cfg)  # before the flow: a refusal is one line, no traceback
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
