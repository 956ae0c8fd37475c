"""Training speed: thresher's trainer packed and unpacked, and TRL's SFTTrainer when installed.

Every side trains the same model on the same rows (chat rows with answers of varied length)
with the same LoRA settings, batch, steps, learning rate and schedule, one epoch, no eval
split; the rows are exactly steps x batch examples, so each side trains on every answer
token once. Speed is answer (trained) tokens per second of the training loop alone (not
model loading, data preparation or export). Repeats alternate the sides (ABBA).

TRL (`pip install -e .[bench]`) runs in its padding-free mode: each micro-batch's examples
flattened into one row with positions restarting per example and completion-only loss,
so a step sees the same number of examples as thresher's. On CPU transformers turns those
positions into a block-diagonal mask (masking_utils), which keeps it exact with sdpa.

Prints `packing speed ratio` (thresher packed / unpacked), `train speed ratio` (thresher
packed / TRL, when TRL is installed), each a median over repeats of the per-repeat ratio,
the padding shares and the loss curves of the first repeat.

    .venv/bin/python bench/train.py [--model DIR] [--lake DIR --round R] [--steps 8]
        [--batch-size 8] [--max-len 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from abba import abba

ROOT = Path(__file__).resolve().parents[1]


def word_problem_rows(n: int, seed: int = 0) -> list[dict]:
    """Chat rows from examples/word-problems: each answer works its way to the result in
    1 to 16 short steps, so rows vary in length (about 40 to 400 tokens of the tiny model's
    tokenizer) as kept answers do."""
    problems = [
        json.loads(line)
        for line in (ROOT / "examples" / "word-problems" / "train.jsonl").read_text().splitlines()
        if line.strip()
    ]
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        p = problems[k % len(problems)]
        steps = " ".join(f"Step {i + 1}: check it." for i in range(rng.randrange(1, 17)))
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": p["prompt"]},
                    {"role": "assistant", "content": f"{steps} The answer is {p['answer']}."},
                ]
            }
        )
    return rows


def lake_rows(lake: str, round_: int, pipeline: str | None, n: int) -> list[dict]:
    """A lake round's kept answers as SFT rows, the first n in a seeded shuffle."""
    from thresher.stores.export import sft_rows
    from thresher.stores.lake import Lake

    rows = sft_rows(Lake(Path(lake)), round_, False, pipeline)
    if len(rows) < n:
        raise SystemExit(f"the lake's round {round_} has {len(rows)} kept rows; need {n}")
    random.Random(0).shuffle(rows)
    return [{"messages": r["messages"]} for r in rows[:n]]


def answer_tokens(model: str, rows: list[dict], max_len: int) -> int:
    """Answer tokens thresher trains on for these rows (its own tokenization)."""
    from transformers import AutoTokenizer

    from thresher.trainers.data import IGNORE, build_examples

    tokenizer = AutoTokenizer.from_pretrained(model)
    examples, _ = build_examples(rows, tokenizer, max_len)
    return sum(sum(t != IGNORE for t in e["labels"]) for e in examples)


def run_thresher(args, rows: list[dict], packing: bool, n_answer: int) -> dict:
    """One thresher training run: answer tokens/s of its loop, losses, padding share."""
    from thresher.config import TrainSettings
    from thresher.trainers.sft import train

    settings = TrainSettings(
        packing=packing,
        max_steps=args.steps,
        batch_size=args.batch_size,
        max_len=args.max_len,
        learning_rate=args.lr,
        eval_fraction=0.0,
        log_every=1,
        save_every=10_000,
        output="adapter",
        lora={"r": args.lora_r, "alpha": 2 * args.lora_r},
    )
    metrics: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        result = train(settings, args.model, rows, tmp, metrics.extend, progress=False)
    last = metrics[-1]
    seconds = last["tokens"] / last["tokens_per_s"]  # the loop's time up to its last step
    return {
        "tokens_per_s": n_answer / seconds,
        "seconds": seconds,
        "losses": [m["loss"] for m in metrics],
        "rows": result.rows,
        "padding_share": result.padding_share,
    }


def in_thresher_order(rows: list[dict]) -> list[dict]:
    """The rows in the order thresher's trainer draws them (its seeded shuffle, then its
    first epoch's batches), so that both sides' step losses are over the same examples."""
    from thresher.config import TrainSettings
    from thresher.trainers.sft import _batches

    seed = TrainSettings().seed
    shuffled = list(range(len(rows)))
    random.Random(seed).shuffle(shuffled)
    batches = _batches(len(rows), len(rows), seed, 0)  # one batch: the epoch's order
    return [rows[shuffled[i]] for b in batches for i in b]


def run_trl(args, rows: list[dict]) -> dict:
    """One TRL SFTTrainer run, padding-free with completion-only loss, as like thresher's as
    its options allow (optimizer, schedule, clipping, no weight decay, fp32 on CPU)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    data = Dataset.from_list(
        [
            {"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}
            for r in in_thresher_order(rows)
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16 if cuda else torch.float32
    )
    times: dict[str, float] = {}
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            times["start"] = time.perf_counter()

        def on_train_end(self, *a, **k):
            times["end"] = time.perf_counter()

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    class InOrder(SFTTrainer):
        # the rows come in thresher's batch order: each step sees the same examples
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    with tempfile.TemporaryDirectory() as tmp:
        config = SFTConfig(
            output_dir=tmp,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=args.lr,
            lr_scheduler_type="cosine",
            warmup_steps=int(args.steps * 0.03),
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            padding_free=True,
            max_length=None,  # padding-free without packing does not truncate: rows fit
            completion_only_loss=True,
            gradient_checkpointing=cuda,
            bf16=cuda,
            use_cpu=not cuda,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
        )
        peft = LoraConfig(
            r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        trainer = InOrder(
            model=model,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=peft,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # its log lines would bury the bench's
        n_answer = sum(sum(t != -100 for t in lab[1:]) for lab in trainer.train_dataset["labels"])
        trainer.train()
    seconds = times["end"] - times["start"]
    return {"tokens_per_s": n_answer / seconds, "seconds": seconds, "losses": losses}


def compare_packing(args, rows: list[dict], n_answer: int, curves: dict) -> None:
    """thresher packed against unpacked: speeds, padding shares, `packing speed ratio`."""
    packed, unpacked = abba(
        lambda: run_thresher(args, rows, True, n_answer),
        lambda: run_thresher(args, rows, False, n_answer),
        args.repeats,
    )
    ratios = [p["tokens_per_s"] / u["tokens_per_s"] for p, u in zip(packed, unpacked, strict=True)]
    for name, runs in (("thresher packed", packed), ("thresher unpacked", unpacked)):
        speeds = ", ".join(f"{r['tokens_per_s']:.0f}" for r in runs)
        print(
            f"{name}: {statistics.median(r['tokens_per_s'] for r in runs):.0f} answer tokens/s "
            f"(runs: {speeds}); {runs[0]['rows']} rows, padding share "
            f"{runs[0]['padding_share']:.3f}"
        )
    print(
        f"packing speed ratio: {statistics.median(ratios):.3f} (per repeat: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + ")"
    )
    curves["thresher packed"] = packed[0]["losses"]
    curves["thresher unpacked"] = unpacked[0]["losses"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / ".cache" / "bench-model"))
    parser.add_argument("--lake", help="train on this lake's kept answers instead")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--pipeline")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-trl", action="store_true", help="thresher packed vs unpacked only")
    parser.add_argument(
        "--no-unpacked", action="store_true", help="thresher packed vs TRL only (a large model)"
    )
    args = parser.parse_args()

    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not Path(args.model, "config.json").exists():
        from thresher.trainers.tiny import make_tiny_model

        print(f"building the tiny model in {args.model}", file=sys.stderr)
        make_tiny_model(args.model, train_steps=150)
    n = args.steps * args.batch_size
    if args.lake:
        rows = lake_rows(args.lake, args.round, args.pipeline, n)
    else:
        rows = word_problem_rows(n)
    n_answer = answer_tokens(args.model, rows, args.max_len)
    try:
        import trl  # noqa: F401

        has_trl = not args.no_trl
    except ImportError:
        has_trl = False
        print("trl is not installed (pip install -e .[bench]): thresher only", file=sys.stderr)

    print(
        f"model {args.model}; {n} rows, {n_answer} answer tokens; {args.steps} steps of "
        f"{args.batch_size}, LoRA r {args.lora_r}, lr {args.lr}, max_len {args.max_len}"
    )
    # each side once untimed first: on CPU the first pass over new tensor shapes ran up to
    # 10x slower here (allocation), and the repeats then see shapes already run
    for packing in (True, False) if not args.no_unpacked else (True,):
        run_thresher(args, rows, packing, n_answer)
    if has_trl:
        run_trl(args, rows)
    curves = {}
    if not args.no_unpacked:
        compare_packing(args, rows, n_answer, curves)
    if has_trl:
        thresher_runs, trl_runs = abba(
            lambda: run_thresher(args, rows, True, n_answer),
            lambda: run_trl(args, rows),
            args.repeats,
        )
        ratios = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(thresher_runs, trl_runs, strict=True)
        ]
        speeds = ", ".join(f"{r['tokens_per_s']:.0f}" for r in trl_runs)
        print(
            f"TRL SFTTrainer (padding-free): "
            f"{statistics.median(r['tokens_per_s'] for r in trl_runs):.0f} answer tokens/s "
            f"(runs: {speeds})"
        )
        print(
            f"train speed ratio: {statistics.median(ratios):.3f} (thresher packed / TRL; "
            "per repeat: " + ", ".join(f"{r:.3f}" for r in ratios) + ")"
        )
        curves["thresher packed (beside TRL)"] = thresher_runs[0]["losses"]
        curves["TRL"] = trl_runs[0]["losses"]
    print("loss curves (first repeat), step: " + " | ".join(curves))
    for step in range(args.steps):
        values = [c[step] if step < len(c) else math.nan for c in curves.values()]
        print(f"  {step + 1:>3}: " + " | ".join(f"{v:.4f}" for v in values))


if __name__ == "__main__":
    main()
