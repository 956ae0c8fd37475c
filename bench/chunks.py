"""Samples spent where they teach: tokens generated per kept example, k at once against k in
chunks that stop a prompt once more samples cannot change how many selection keeps of it
(`sampling.chunk`): on the same samples both sides keep the same number.

Both curate the same prompts with the same model, verifiers and selection (cap distinct
passing answers per prompt; by default the frontier filter `max_pass_rate: 0.99`, which
drops prompts solved every time and so needs all k of a prompt that keeps passing) in lakes
of their own, on one shared engine; candidates are the same whichever way k is reached, so
the chunked side samples a subset of the fixed side's candidate identities. Prints each
side's tokens, kept examples and tokens per kept example, and `tokens per kept example
ratio: X` (fixed / chunked; above 1: chunks spend fewer tokens per kept example).

    .venv/bin/python bench/chunks.py [--prompts 400] [--k 8] [--chunk 2] [--cap 2]
        [--max-pass-rate 0.99]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from shared import WORD_MODEL, options, word_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = options(__doc__, prompts=400, k=8, chunk=2, cap=2, model=WORD_MODEL)
    parser.add_argument(
        "--max-pass-rate",
        type=float,
        default=0.99,
        help="selection's frontier filter on both sides (1: off, keep always-solved prompts)",
    )
    args = parser.parse_args()

    import os

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake
    from thresher.verifiers.math_answer import MathAnswer

    word_model(args.model)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, chunk in (("k at once", None), (f"chunks of {args.chunk}", args.chunk)):
            lake = Lake(Path(tmp) / side.replace(" ", "-"))
            ingest(lake, ROOT / "examples" / "word-problems" / "train.jsonl",
                   dataset="words", task="arithmetic")  # fmt: skip
            cfg = CurateConfig(
                name="bench-chunks",
                model=args.model,
                batch_size=256,
                prompts={"dataset": "words", "limit": args.prompts},
                sampling={
                    "k": args.k,
                    "chunk": chunk,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "max_tokens": 32,
                },  # fmt: skip
                engine={"dtype": "float32", "max_model_len": 256},
                verify={"verifiers": [MathAnswer.name]},
                select={
                    "cap": args.cap,
                    "near_dup": False,
                    "max_pass_rate": args.max_pass_rate if args.max_pass_rate < 1 else None,
                    "decontaminate": {"enabled": False},
                },
            )
            summary = run_curate(cfg, lake.root, progress=False)
            tokens = lake.query("SELECT sum(n_tokens) FROM candidates")[0, 0]
            out[side] = (tokens, summary["kept"], summary["candidates"])
    for side, (tokens, kept, candidates) in out.items():
        print(
            f"{side:>12}: {candidates} candidates, {tokens} tokens, {kept} kept, "
            f"{tokens / max(kept, 1):.1f} tokens per kept example"
        )
    (t_fixed, k_fixed, _), (t_chunk, k_chunk, _) = out.values()
    print(f"kept: {k_chunk / max(k_fixed, 1):.3f} of the fixed side's")
    ratio = (t_fixed / max(k_fixed, 1)) / (t_chunk / max(k_chunk, 1))
    print(f"tokens per kept example ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
