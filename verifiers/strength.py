"""Test strength: how many mutants of a prompt's reference solution its tests kill, and
stronger tests made from the reference's own answers on mutated inputs.

For each code prompt with a reference solution: the reference must pass its own tests
(else the prompt is flagged and nothing more is done); mutants of the reference run
against the tests through the judge; new inputs (the tests' own inputs, mutated) run
through the reference in the sandbox. Of the inputs it answers, some become new tests
(one per distinct answer first), each kept only if the reference then passes it; a
sample drawn apart judges whether a mutant differs from the reference, so some of its
inputs are ones the tests never saw. A mutant that answers every judged input as the
reference does is a likely equivalent mutant, reported apart from the kill rate.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from thresher.ids import content_id
from thresher.sandbox import Job, Limits, run_jobs
from thresher.sandbox.programs import compare_output
from thresher.sandbox.protocol import decode
from thresher.stores.queries import code_prompts, recorded_audits
from thresher.stores.tables import write_test_strength
from thresher.verifiers.code import BadTests, build_job, parse_tests
from thresher.verifiers.mutants import (
    assert_line,
    call_inputs,
    extend_tests,
    make_mutants,
    mutate_inputs,
    mutate_stdin,
    named_calls,
)

if TYPE_CHECKING:
    from thresher.stores.lake import Lake

ORIGINAL, STRENGTHENED = "original", "strengthened"


@dataclass
class Problem:
    """One code prompt as the audit sees it."""

    prompt_id: str
    prompt: str | None
    tests: str  # as stored
    meta: str | None
    reference: str  # the whole reference program
    entry: str | None  # the function the tests call; None: a stdin/stdout program
    parsed: str | list = ""
    style: str = ""  # "check" (test code), "asserts" or "stdio"


def reference_of(row: dict) -> tuple[str | None, str | None, str]:
    """(reference code, entry point, why there is none) of a prompt row."""
    try:
        meta = json.loads(row.get("meta") or "{}")
    except json.JSONDecodeError:
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    entry = meta.get("entry_point") or meta.get("fn_name")
    if isinstance(meta.get("canonical_solution"), str):  # HumanEval: a completion
        return (row.get("prompt") or "") + meta["canonical_solution"], entry, ""
    code = meta.get("reference_solution") or meta.get("solution")
    if not isinstance(code, str) or not code.strip():
        return None, entry, "no reference solution in the prompt's meta"
    return code, entry, ""


def _entry_of_asserts(tests: list, code: str) -> str | None:
    """The function an assert list calls that the reference defines (MBPP names none)."""
    import ast

    try:
        defined = {n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)}
    except (SyntaxError, ValueError):
        return None
    return next((n.func.id for n in named_calls(tests) if n.func.id in defined), None)


def problem_of(row: dict) -> tuple[Problem | None, str]:
    """The audit's view of a prompt row, or (None, why it cannot be audited)."""
    code, entry, why = reference_of(row)
    if code is None:
        return None, why
    try:
        parsed = parse_tests(row.get("tests"), entry)
    except BadTests as e:
        return None, str(e)
    if isinstance(parsed, list) and parsed and isinstance(parsed[0], dict):
        style, entry = "stdio", None
    elif isinstance(parsed, list):
        style, entry = "asserts", entry or _entry_of_asserts(parsed, code)
    else:
        style = "check"
    if style != "stdio" and not entry:
        return None, "the tests call no function the reference defines"
    problem = Problem(
        row["prompt_id"], row.get("prompt"), row["tests"], row.get("meta"), code, entry
    )
    problem.parsed, problem.style = parsed, style
    return problem, ""


def _judge(problem: Problem, code: str, tests: str) -> Job:
    return build_job(code, problem.prompt, tests, problem.meta)


@dataclass
class Audit:
    """One prompt's audit: both suites' figures and the strengthened tests."""

    problem: Problem
    reference_passes: bool = False
    reference_reason: str = ""
    mutants: list[tuple[str, str]] = field(default_factory=list)
    killed: list[bool] = field(default_factory=list)  # by the original tests
    killed_strong: list[bool] = field(default_factory=list)
    equivalent: list[bool] = field(default_factory=list)  # the reference's answers everywhere
    generated: int = 0
    kept: list = field(default_factory=list)  # (input, new test) of the strengthened suite
    answers: list = field(default_factory=list)  # (input, the reference's value) of all
    dropped: dict[str, int] = field(default_factory=dict)
    strong_tests: str | None = None


def _drop(audit: Audit, why: str) -> None:
    audit.dropped[why] = audit.dropped.get(why, 0) + 1


def _decode(value: dict):
    return decode(value["ok"])


def audit_problems(
    problems: list[Problem],
    mutants: int = 20,
    inputs: int = 30,
    limits: Limits | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] = lambda step: None,
) -> list[Audit]:
    """Audit each problem: its reference, its mutants, its tests and stronger ones."""
    limits = limits or Limits(timeout_s=10, test_timeout_s=1)
    audits = [Audit(p) for p in problems]
    progress("the references against their own tests")
    outs = run_jobs(
        [_judge(a.problem, a.problem.reference, a.problem.tests) for a in audits], limits, workers
    )
    for a, out in zip(audits, outs, strict=True):
        a.reference_passes, a.reference_reason = out.passed, out.reason
    live = [a for a in audits if a.reference_passes]
    for a in live:
        a.mutants = make_mutants(a.problem.reference, a.problem.entry, mutants, a.problem.prompt_id)
    progress("the mutants against the original tests")
    jobs = [_judge(a.problem, code, a.problem.tests) for a in live for _, code in a.mutants]
    outs = iter(run_jobs(jobs, limits, workers))
    for a in live:
        a.killed = [not next(outs).passed for _ in a.mutants]
    progress("new inputs through the references")
    probes = [_new_inputs(a, inputs) for a in live]
    outs = run_jobs(
        [
            Job(a.problem.reference, {"inputs": xs}, a.problem.entry)
            for a, xs in zip(live, probes, strict=True)
        ],
        _probe_limits(limits, 4 * inputs),
        workers,
    )
    for a, xs, out in zip(live, probes, outs, strict=True):
        _keep_answered(a, xs, out.values or [], inputs)
    progress("the strengthened tests against the references")
    _confirm_with_reference(live, limits, workers)
    progress("the mutants against the strengthened tests")
    _judge_strengthened(live, limits, workers)
    return audits


def _new_inputs(a: Audit, n: int) -> list:
    """Up to 4n generated inputs, the nearest variants of the tests' own inputs first."""
    p = a.problem
    if p.style == "stdio":
        xs = mutate_stdin([t["input"] for t in p.parsed], 4 * n, p.prompt_id)
    else:
        xs = mutate_inputs(call_inputs(p.parsed, p.entry), 4 * n, p.prompt_id)
    a.generated = len(xs)
    return xs


def _probe_limits(limits: Limits, inputs: int) -> Limits:
    """A probe's limits: each input its own `test_timeout_s`, the job time for all of them."""
    per = limits.test_timeout_s or limits.timeout_s
    return replace(limits, timeout_s=max(limits.timeout_s, per * inputs + 5))


def _keep_answered(a: Audit, xs: list, values: list, n: int) -> None:
    """Of the inputs the reference answers, n become tests (in turn: the next input with an
    answer not seen yet, and the next nearest input) and a uniform seeded sample of n more,
    drawn apart, judges whether a mutant differs (some of those may be tests too); the
    inputs it fails on are dropped, with why."""
    call = "candidate" if a.problem.style == "check" else a.problem.entry
    answered = []
    for x, value in zip(xs, values, strict=False):
        if "error" in value:
            timed_out = "time" in value["error"]
            _drop(a, "the reference ran out of time" if timed_out else "the reference failed on it")
            continue
        if a.problem.style == "stdio":
            if not value["ok"].strip():
                _drop(a, "the reference printed nothing")
                continue
            test = {"input": x, "output": value["ok"]}
        else:
            test = assert_line(call, x, _decode(value))
            if test is None:
                _drop(a, "no literal form for an argument or the value")
                continue
        answered.append((x, value, test))
    for _ in range(len(xs) - len(values)):
        _drop(a, "not run")
    seen, first, rest = set(), [], []
    for item in answered:
        key = json.dumps(item[1], sort_keys=True)
        (rest if key in seen else first).append(item)
        seen.add(key)
    tests, taken = [], set()
    for pair in zip(first + rest, answered, strict=True):  # new answers and nearest, in turn
        for item in pair:
            if repr(item[0]) not in taken and len(tests) < n:
                taken.add(repr(item[0]))
                tests.append(item)
    judge = random.Random(f"{a.problem.prompt_id}/judge").sample(answered, min(n, len(answered)))
    a.kept = [(x, test) for x, _, test in tests]
    union = {repr(x): (x, value) for x, value, _ in tests + judge}
    a.answers = list(union.values())


def _confirm_with_reference(live: list[Audit], limits: Limits, workers: int | None) -> None:
    """A generated test enters only if the reference passes it (one by one where the whole
    strengthened suite fails)."""
    for a in live:
        a.strong_tests = extend_tests(a.problem.parsed, [t for _, t in a.kept], a.problem.entry)
    extended = [a for a in live if a.kept]
    outs = run_jobs(
        [_judge(a.problem, a.problem.reference, a.strong_tests) for a in extended],
        limits,
        workers,
    )
    failing = [a for a, out in zip(extended, outs, strict=True) if not out.passed]
    jobs = [
        _judge(a.problem, a.problem.reference, extend_tests(a.problem.parsed, [t], a.problem.entry))
        for a in failing
        for _, t in a.kept
    ]
    outs = iter(run_jobs(jobs, limits, workers))
    for a in failing:
        passing = [kt for kt in a.kept if next(outs).passed]
        for _ in range(len(a.kept) - len(passing)):
            _drop(a, "the reference fails the generated test")
        a.kept = passing
        a.strong_tests = extend_tests(a.problem.parsed, [t for _, t in a.kept], a.problem.entry)


def _judge_strengthened(live: list[Audit], limits: Limits, workers: int | None) -> None:
    """Surviving mutants: against the strengthened tests, and probed on every generated
    input (the reference's answers on all of them: a likely equivalent mutant)."""
    survivors = [(a, i) for a in live for i, k in enumerate(a.killed) if not k]
    jobs = [_judge(a.problem, a.mutants[i][1], a.strong_tests) for a, i in survivors]
    strong = run_jobs(jobs, limits, workers)
    probes = run_jobs(
        [
            Job(a.mutants[i][1], {"inputs": [x for x, _ in a.answers]}, a.problem.entry)
            for a, i in survivors
        ],
        _probe_limits(limits, max((len(a.answers) for a, _ in survivors), default=1)),
        workers,
    )
    for a in live:
        a.killed_strong = list(a.killed)
        a.equivalent = [False] * len(a.mutants)
    for (a, i), out, probe in zip(survivors, strong, probes, strict=True):
        a.killed_strong[i] = not out.passed
        a.equivalent[i] = _same_answers(a, probe.values or [])


def _same_answers(a: Audit, values: list) -> bool:
    if len(values) != len(a.answers):
        return False
    for (_, want), got in zip(a.answers, values, strict=True):
        if "error" in got:
            return False
        if a.problem.style == "stdio":
            if not compare_output(got["ok"], want["ok"])[0]:
                return False
        elif not _same_value(_decode(got), _decode(want)):
            return False
    return True


def _same_value(got, want) -> bool:
    """Equal, floats within 1e-9 relative (as the generated asserts compare them)."""
    if type(want) is float and type(got) in (int, float):
        return abs(got - want) <= 1e-9 * max(1.0, abs(want))
    return type(got) is type(want) and got == want


def rows_of(a: Audit) -> list[dict]:
    """The `test_strength` figures of one audit: one row per suite (one if flagged)."""
    base = {"prompt_id": a.problem.prompt_id, "reference_passes": a.reference_passes}
    if not a.reference_passes:
        return [
            {
                **base,
                "suite": ORIGINAL,
                "tests": a.problem.tests,
                "mutants": 0,
                "killed": 0,
                "equivalent": 0,
                "kill_rate": None,
                "survivors": "[]",
                "note": f"the reference fails its own tests: {a.reference_reason}",
            }
        ]
    out = []
    for suite, killed, tests in (
        (ORIGINAL, a.killed, a.problem.tests),
        (STRENGTHENED, a.killed_strong, a.strong_tests),
    ):
        survivors = [
            {"kind": kind, "equivalent": eq}
            for (kind, _), k, eq in zip(a.mutants, killed, a.equivalent, strict=True)
            if not k
        ]
        equivalent = sum(s["equivalent"] for s in survivors)
        judged = len(a.mutants) - equivalent
        out.append(
            {
                **base,
                "suite": suite,
                "tests": tests,
                "mutants": len(a.mutants),
                "killed": sum(killed),
                "equivalent": equivalent,
                "kill_rate": sum(killed) / judged if judged else None,
                "survivors": json.dumps(survivors),
                "note": "" if a.mutants else "nothing to mutate in the reference",
            }
        )
    strong = out[1]
    strong.update(
        generated=a.generated, kept=len(a.kept), dropped=json.dumps(a.dropped, sort_keys=True)
    )
    return out


STRENGTH_VERSION = 1  # raised when the same settings would audit differently


def audit_dataset(
    lake: Lake,
    dataset: str,
    split: str | None = None,
    mutants: int = 20,
    inputs: int = 30,
    limit: int | None = None,
    workers: int | None = None,
    limits: Limits | None = None,
    chunk: int = 32,
    run_id: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict:
    """Audit a dataset's code prompts and record each audit in `test_strength`, a chunk of
    prompts per commit; prompts audited before with the same settings are skipped, so a
    stopped run resumes and a finished one audits nothing. Returns the run's counts."""
    settings = {"mutants": mutants, "inputs": inputs, "version": STRENGTH_VERSION}
    rows = code_prompts(lake, dataset, split, limit).to_dicts()
    summary = {"prompts": len(rows), "audited": 0, "already": 0, "skipped": {}}
    problems, ids = [], {}
    for row in rows:
        problem, why = problem_of(row)
        if problem is None:
            summary["skipped"][why] = summary["skipped"].get(why, 0) + 1
            continue
        ids[problem.prompt_id] = content_id(
            "tests-audit", row["prompt_id"], row["prompt"], row["tests"], row["meta"], settings
        )
        problems.append(problem)
    done = recorded_audits(lake, list(ids.values()))
    todo = [p for p in problems if ids[p.prompt_id] not in done]
    summary["already"] = len(problems) - len(todo)
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        audits = audit_problems(part, mutants, inputs, limits, workers)
        out = [
            {
                **r,
                "audit_id": ids[a.problem.prompt_id],
                "dataset": dataset,
                "tests_id": content_id(r["tests"]),
                "settings": json.dumps(settings),
            }
            for a in audits
            for r in rows_of(a)
        ]
        write_test_strength(lake, out, run_id)
        summary["audited"] += len(part)
        progress(f"audited {summary['already'] + summary['audited']}/{len(problems)} prompts")
    return summary
