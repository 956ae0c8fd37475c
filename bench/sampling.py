"""Sampling overhead: thresher's curate sampling stage against a bare vLLM generate loop.

Both sample the same prompts with the same parameters and batch size on one shared
engine; thresher's side also renders prompts, checks the lake for finished work, builds
candidate rows and writes them to the lake, one Prefect task per batch, timed inside the
flow (the flow run's own start-up, paid once per curate run, is printed separately).
Repeats alternate the two (ABBA: the side that goes first alternates, so drift on a
shared machine cancels). Prints `sampling overhead ratio: X`, the median over repeats of
thresher's time per generated token / bare time per generated token of the two runs of a
repeat (run back to back, they share the machine's state of the moment; sampled answers
differ in length between runs, so time alone would compare different work), the same
median of plain time ratios, and the ratio of the two sides' median times.

    .venv/bin/python bench/sampling.py [--prompts 512] [--k 8] [--batch-size 256] [--repeats 9]
    .venv/bin/python bench/sampling.py --model .cache/smollm2-135m-instruct --dtype auto \
        --max-model-len 1024 --prompts 32 --k 4 --max-tokens 64 --repeats 5
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from abba import abba
from shared import options

ROOT = Path(__file__).resolve().parents[1]


def build_prompts(n: int) -> list[str]:
    prompts = [f"What is {a} {op} {b}?" for a in range(20) for b in range(20) for op in "+*"]
    if n > len(prompts):
        raise SystemExit(f"at most {len(prompts)} prompts")
    return prompts[:n]


def chat_prompts(n: int) -> list[str]:
    """Questions a chat model answers in a few sentences (longer answers than build_prompts)."""
    return [f"{p} Explain your steps briefly." for p in build_prompts(n)]


def main() -> None:
    parser = options(__doc__, prompts=512, k=8, batch_size=256, max_tokens=32)
    parser.add_argument("--repeats", type=int, default=9, help="at least 5")
    parser.add_argument("--model", default=str(ROOT / ".cache" / "bench-model"))
    parser.add_argument(
        "--dtype", default="float32", help="engine dtype (auto: the model's, e.g. bf16 SmolLM2)"
    )
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument(
        "--chat",
        action="store_true",
        help="chat prompts through the model's template (bare side: LLM.chat); longer answers",
    )
    args = parser.parse_args()

    import os

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect import flow
    from prefect.utilities.annotations import quote
    from vllm import SamplingParams

    from thresher.config import CurateConfig
    from thresher.flows.runtime import flow_settings
    from thresher.flows.tasks import sample_task
    from thresher.ingest.load import ingest
    from thresher.plan import Batch, plan_curate
    from thresher.samplers.engines import local_engine
    from thresher.stores.lake import Lake
    from thresher.stores.queries import load_prompts
    from thresher.trainers.tiny import make_tiny_model

    if not (Path(args.model) / "config.json").exists():
        make_tiny_model(args.model, train_steps=150)
    prompts = chat_prompts(args.prompts) if args.chat else build_prompts(args.prompts)
    cfg = CurateConfig(
        name="bench-sampling",
        model=args.model,
        batch_size=args.batch_size,
        prompts={"dataset": "bench"},
        sampling={"k": args.k, "max_tokens": args.max_tokens, "chat": args.chat},
        engine={"dtype": args.dtype, "max_model_len": args.max_model_len},
    )
    s = cfg.sampling
    llm = local_engine(cfg)  # the very engine the sampling stage uses
    params = SamplingParams(
        n=s.k, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens
    )

    def bare() -> tuple[float, int]:
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(prompts), args.batch_size):
            part = prompts[i : i + args.batch_size]
            if args.chat:  # the same messages thresher renders through the template
                outs = llm.chat(
                    [[{"role": "user", "content": p}] for p in part], params, use_tqdm=False
                )
            else:
                outs = llm.generate(part, params, use_tqdm=False)
            for out in outs:
                tokens += sum(len(c.token_ids) for c in out.outputs)
        return time.perf_counter() - start, tokens

    @flow(name="bench-sampling-stage")
    def stage(lake_root: str, batches: list[list[dict]]) -> float:
        # timed inside the flow: a curate run pays the flow's own start once, not per batch
        start = time.perf_counter()
        plan = plan_curate(cfg)
        for batch in batches:
            sample_task(lake_root, quote(plan), quote(cfg), quote(Batch(prompts=batch)))
        return time.perf_counter() - start

    def thresher() -> tuple[float, int]:
        tmp = tempfile.mkdtemp(prefix="thresher-bench-")
        src = Path(tmp) / "prompts.jsonl"
        src.write_text("".join(f'{{"prompt": "{p}", "task": "arith"}}\n' for p in prompts))
        lake = Lake(Path(tmp) / "lake")
        ingest(lake, src, dataset="bench")
        rows = load_prompts(lake, "bench", "train").select("prompt_id", "prompt", "messages")
        rows = rows.to_dicts()
        batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
        start = time.perf_counter()
        with flow_settings():  # what `thresher curate` runs its flow with
            took = stage(str(lake.root), batches)
        flow_costs.append(time.perf_counter() - start - took)
        written = lake.query("SELECT count(*) AS n, sum(n_tokens) AS t FROM candidates")
        assert written["n"][0] == len(prompts) * s.k, "thresher wrote the wrong number of rows"
        return took, int(written["t"][0])

    flow_costs: list[float] = []
    warm = bare()  # warms the engine and its prefix cache for both sides
    thresher()  # starts Prefect's temporary server outside the timed runs
    bare_runs, thresher_runs = abba(bare, thresher, args.repeats)
    candidates = len(prompts) * s.k
    bare_t = statistics.median(t for t, _ in bare_runs)
    thr_t = statistics.median(t for t, _ in thresher_runs)
    bare_tok = statistics.median(n for _, n in bare_runs)
    thr_tok = statistics.median(n for _, n in thresher_runs)
    print(
        f"prompts {len(prompts)}, k {s.k}, candidates per run {candidates}, "
        f"batch size {args.batch_size}, repeats {args.repeats} (warm-up {warm[0]:.2f} s)"
    )
    print(
        f"bare vllm {'chat' if args.chat else 'generate'}: {bare_t:.2f} s median, "
        f"{candidates / bare_t:.0f} candidates/s, "
        f"{bare_tok:.0f} tokens, {bare_tok / bare_t:.0f} tokens/s"
    )
    print(
        f"thresher sampling stage: {thr_t:.2f} s median, {candidates / thr_t:.0f} candidates/s, "
        f"{thr_tok:.0f} tokens, {thr_tok / thr_t:.0f} tokens/s"
    )
    print(
        f"(each Prefect flow run adds {statistics.median(flow_costs):.2f} s once per run, "
        "outside the stage)"
    )
    pairs = [t / b for (t, _), (b, _) in zip(thresher_runs, bare_runs, strict=True)]
    # sampled answers differ in length from run to run: time per generated token is what
    # both sides are compared on (a run that drew longer answers is not slower)
    per_token = [
        (t / tn) / (b / bn) for (t, tn), (b, bn) in zip(thresher_runs, bare_runs, strict=True)
    ]
    print(f"ratio of the medians: {thr_t / bare_t:.3f}")
    print(f"per-repeat time ratios: {[round(r, 3) for r in pairs]}")
    print(f"time ratio (median of the per-repeat ratios): {statistics.median(pairs):.3f}")
    print(f"per-repeat time-per-token ratios: {[round(r, 3) for r in per_token]}")
    print(f"sampling overhead ratio: {statistics.median(per_token):.3f}")


if __name__ == "__main__":
    main()
