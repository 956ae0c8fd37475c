"""Engine settings profile: bare vLLM `LLM.chat` tokens/s under each setting, one fresh engine
(a child process) per setting, beside the engine thresher builds with its own defaults.

Every row samples the same chat prompts (bench/sampling.py's `chat_prompts`) with the same
sampling parameters; a warm-up pass fills the prefix cache, then `--runs` timed passes are
made and their median tokens/s printed. Settings that change process-wide state (KV cache
size, thread binding) can only be tried with a fresh engine, hence one process each.

    .venv/bin/python bench/engine_profile.py --model .cache/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from shared import options

ROOT = Path(__file__).resolve().parents[1]


def setting(dtype: str, kv_gib: str, bind: str | None = None, **engine) -> tuple[dict, dict]:
    """(engine arguments, environment) of a bare engine: its dtype and other arguments, the
    KV cache size and where vLLM binds its threads (None: vLLM's default)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": kv_gib}
    if bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return {"dtype": dtype, **engine}, env


# name -> (engine arguments, environment); None in arguments means thresher's get_engine
SETTINGS: dict[str, tuple[dict | None, dict]] = {
    "thresher defaults (get_engine)": (None, {}),
    "bf16, KV 1 GiB, max_num_seqs 256": setting("bfloat16", "1"),
    "bf16, KV 6 GiB, max_num_seqs 256": setting("bfloat16", "6"),
    "bf16, KV 6 GiB, max_num_seqs 64": setting("bfloat16", "6", max_num_seqs=64),
    "bf16, KV 6 GiB, threads bound to core 0": setting("bfloat16", "6", "0"),
    "bf16, KV 6 GiB, threads bound to cores 0-1": setting("bfloat16", "6", "0-1"),
    "bf16, KV 6 GiB, threads not bound (nobind)": setting("bfloat16", "6", "nobind"),
    "bf16, KV 1 GiB, threads bound to cores 0-1": setting("bfloat16", "1", "0-1"),
    "float32, KV 6 GiB, max_num_seqs 256": setting("float32", "6"),
    "float32, KV 6 GiB, threads bound to cores 0-1": setting("float32", "6", "0-1"),
}


def one(args) -> None:
    """Run one setting in this process and print its figures as one JSON line."""
    sys.path.insert(0, str(ROOT / "bench"))
    from sampling import chat_prompts
    from vllm import LLM, SamplingParams

    engine_args = json.loads(args.one)
    start = time.perf_counter()
    if engine_args is None:
        from thresher.samplers.vllm_offline import get_engine

        llm = get_engine(args.model, max_model_len=args.max_model_len)
    else:
        llm = LLM(
            model=args.model,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=0.2,
            enforce_eager=True,
            enable_prefix_caching=True,
            **engine_args,
        )
    started = time.perf_counter() - start
    messages = [[{"role": "user", "content": p}] for p in chat_prompts(args.prompts)]
    params = SamplingParams(n=args.k, temperature=0.7, top_p=0.9, max_tokens=args.max_tokens)
    llm.chat(messages[:4], params, use_tqdm=False)  # warm-up
    rates, tokens = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        outs = llm.chat(messages, params, use_tqdm=False)
        took = time.perf_counter() - t0
        n = sum(len(c.token_ids) for o in outs for c in o.outputs)
        rates.append(n / took)
        tokens.append(n)
    kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    print(
        "RESULT "
        + json.dumps(
            {
                "tokens_per_s": statistics.median(rates),
                "runs": [round(r, 1) for r in rates],
                "tokens": statistics.median(tokens),
                "start_s": started,
                "kv_gib": kv,
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = options(
        __doc__,
        model=str(ROOT / ".cache" / "smollm2-135m-instruct"),
        prompts=16,
        k=4,
        max_tokens=128,
        max_model_len=1024,
        runs=2,
    )
    parser.add_argument(
        "--only", action="append", help="run only settings whose name contains this (repeatable)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        one(args)
        return
    print(
        f"model {args.model}, {args.prompts} chat prompts x n {args.k}, max_tokens "
        f"{args.max_tokens}, max_model_len {args.max_model_len}, median of {args.runs} runs",
        flush=True,
    )
    print("| setting | tokens/s | runs | KV GiB | engine start s |")
    print("|---|---|---|---|---|", flush=True)
    best = ("", 0.0)
    for name, (engine_args, env) in SETTINGS.items():
        if args.only and not any(part in name for part in args.only):
            continue
        child_env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", **env}
        if engine_args is None:  # thresher chooses these itself
            child_env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            child_env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        argv = [sys.executable, __file__, "--one", json.dumps(engine_args)]
        for flag in ("model", "prompts", "k", "max_tokens", "max_model_len", "runs"):
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        proc = subprocess.run(argv, env=child_env, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"| {name} | failed: {proc.stderr.strip().splitlines()[-1:]} | | | |")
            continue
        r = json.loads(line[len("RESULT ") :])
        print(
            f"| {name} | {r['tokens_per_s']:.0f} | {r['runs']} | {r['kv_gib']} | "
            f"{r['start_s']:.0f} |",
            flush=True,
        )
        if engine_args is not None and r["tokens_per_s"] > best[1]:
            best = (name, r["tokens_per_s"])
    if best[0]:
        print(f"best bare setting: {best[0]} ({best[1]:.0f} tokens/s)")


if __name__ == "__main__":
    main()
