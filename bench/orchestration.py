"""Orchestration overhead: a whole curate round as a Prefect flow against direct calls
of the same library functions.

Both sides do the same work on the same engine: load the prompts, plan k per prompt,
then per batch sample (vLLM), verify (math) and select (dedup, cap), then summarise the
run, into a fresh lake each time. The flow side is `curate_flow` itself: a flow run,
three Prefect tasks per batch, the run recorded in `runs`, a markdown artifact. The
direct side calls the tasks' underlying functions (`task.fn`) in a plain loop. The
temporary Prefect server's one-off start is measured first and reported separately.
Repeats alternate the two sides (ABBA: the side that goes first alternates, so drift on
a shared machine cancels). Prints `orchestration overhead ratio: X`, the median over
repeats of flow time / direct time of the two runs of a repeat (run back to back, they
share the machine's state of the moment, which on a shared 2-core machine moves either
run by ±10 %), the ratio of the medians, and the time each side spends outside the task
bodies (the orchestration itself, measured apart from the work's own noise).

    .venv/bin/python bench/orchestration.py [--prompts 4000] [--k 1] [--repeats 11]

Greedy sampling by default, so every run samples, verifies and selects the same texts
(with temperature > 0 the engine's random state moves on between runs and the work
itself varies by more than the overhead being measured).
"""

from __future__ import annotations

import functools
import statistics
import time

from abba import abba
from shared import WORD_MODEL, fresh_lake, options, word_model, word_problems


def main() -> None:
    parser = options(__doc__, prompts=4000, k=1, batch_size=1000, max_tokens=32)
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 (greedy): every run does the same work"
    )
    parser.add_argument("--repeats", type=int, default=11, help="at least 5")
    parser.add_argument("--model", default=WORD_MODEL)
    args = parser.parse_args()

    import os

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect import flow

    from thresher.config import CurateConfig
    from thresher.flows.curate import curate_flow
    from thresher.flows.runtime import flow_settings, quiet_task_logs, stop_engine
    from thresher.flows.tasks import batched, prompt_rows, sample_task, select_task, verify_task
    from thresher.plan import Batch, plan_curate
    from thresher.samplers.engines import local_engine
    from thresher.samplers.stage import sampling_plan
    from thresher.stores.queries import run_summary
    from thresher.verifiers.math_answer import MathAnswer

    word_model(args.model)
    tmp, source = word_problems("thresher-bench-orch-", args.prompts, seed=1)
    cfg = CurateConfig(
        name="bench-orchestration",
        model=args.model,
        batch_size=args.batch_size,
        prompts={"dataset": "bench"},
        sampling={
            "k": args.k,
            "temperature": args.temperature,
            "top_p": 1.0,
            "max_tokens": args.max_tokens,
        },
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": [MathAnswer.name]},
        select={"cap": 4, "decontaminate": {"enabled": False}},
    )
    quiet_task_logs()

    # Time spent inside the task bodies, on both sides: the rest is orchestration
    inside = {"s": 0.0}

    def timed(fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                inside["s"] += time.perf_counter() - start

        return wrapper

    for t in (sample_task, verify_task, select_task):
        t.fn = timed(t.fn)

    def direct() -> tuple[float, float, int]:
        lake = fresh_lake(tmp, source)
        plan = plan_curate(cfg)
        root = str(lake.root)
        inside["s"] = 0.0
        start = time.perf_counter()
        prompts = prompt_rows(lake, cfg)
        ks = sampling_plan(lake, cfg, [r["prompt_id"] for r in prompts])
        for batch in batched(prompts, cfg.batch_size):
            ids = sample_task.fn(root, plan, cfg, Batch(prompts=batch, ks=ks)).ids
            verify_task.fn(root, plan, cfg.verify, Batch(candidate_ids=ids))
            select_task.fn(root, plan, cfg.select, Batch(candidate_ids=ids))
        summary = run_summary(lake, plan.selection_id)
        took = time.perf_counter() - start
        return took, took - inside["s"], summary["candidates"]

    def as_flow() -> tuple[float, float, int]:
        lake = fresh_lake(tmp, source)
        inside["s"] = 0.0
        start = time.perf_counter()
        with flow_settings():  # what `thresher curate` (run_curate) runs the flow with
            summary = curate_flow(cfg, str(lake.root), False)
        took = time.perf_counter() - start
        return took, took - inside["s"], summary.candidates

    @flow(name="bench-noop")
    def noop() -> None:
        return None

    start = time.perf_counter()
    with flow_settings():  # the temporary server starts with the settings curate gives it
        noop()  # starts Prefect's temporary server (unless PREFECT_API_URL points at one)
    server_start = time.perf_counter() - start
    start = time.perf_counter()
    with flow_settings():
        noop()
    empty_flow = time.perf_counter() - start
    local_engine(cfg)  # one engine for both sides, started outside the timings
    direct()  # warm-up: math-verify caches, DuckDB, the engine's prefix cache
    first_flow = as_flow()[0]  # and the flow's one-off registration in this process
    try:
        flow_runs, direct_runs = abba(as_flow, direct, args.repeats)
    finally:
        stop_engine()
    counts = {n for *_, n in flow_runs + direct_runs}
    assert counts == {args.prompts * args.k}, f"sides wrote different candidate counts: {counts}"
    flow_t = [t for t, _, _ in flow_runs]
    direct_t = [t for t, _, _ in direct_runs]
    flow_outside = statistics.median(o for _, o, _ in flow_runs)
    direct_outside = statistics.median(o for _, o, _ in direct_runs)
    batches = -(-args.prompts // args.batch_size)
    print(
        f"prompts {args.prompts}, k {args.k}, candidates per run {args.prompts * args.k}, "
        f"{batches} batches x 3 tasks, repeats {args.repeats}"
    )
    print(f"temporary Prefect server start (once per process): {server_start:.2f} s")
    print(f"an empty flow run: {empty_flow:.2f} s; the first curate flow run: {first_flow:.2f} s")
    print(
        f"direct library calls: best {min(direct_t):.2f} s, median "
        f"{statistics.median(direct_t):.2f} s ({[round(t, 2) for t in direct_t]})"
    )
    print(
        f"curate as a Prefect flow: best {min(flow_t):.2f} s, median "
        f"{statistics.median(flow_t):.2f} s ({[round(t, 2) for t in flow_t]})"
    )
    print(
        f"time outside the task bodies per round (median): flow {flow_outside:.3f} s, "
        f"direct {direct_outside:.3f} s"
    )
    pairs = [f / d for f, d in zip(flow_t, direct_t, strict=True)]
    print(f"ratio of the medians: {statistics.median(flow_t) / statistics.median(direct_t):.3f}")
    print(f"per-repeat ratios: {[round(r, 3) for r in pairs]}")
    print(f"orchestration overhead ratio: {statistics.median(pairs):.3f}")


if __name__ == "__main__":
    main()
