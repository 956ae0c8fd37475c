"""The `code` verifier: the candidate's code passes the prompt's tests, run in a sandbox."""

from __future__ import annotations

import ast
import json
import re
from typing import TYPE_CHECKING, Literal

import polars as pl
from pydantic import Field

from thresher.sandbox import Job, Limits, run_jobs
from thresher.stores.queries import with_strengthened_tests
from thresher.verifiers.base import Verdict, Verifier, verdict_frame

if TYPE_CHECKING:
    from thresher.stores.lake import Lake

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
ISOLATIONS = ("referee", "shared")
# the referee's former name: configs that spell it out keep their verdicts (and digests)
FORMER_ISOLATIONS = {"judge": "referee"}


class BadTests(ValueError):
    """The prompt's tests cannot check anything; the message is the verdict's reason."""


def extract_code(text: str) -> str:
    """The last fenced code block, else the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def _syntax(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise BadTests(f"{what} does not compile: {e.msg} (line {e.lineno})") from None


def _asserts(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Assert) for node in ast.walk(tree))


def parse_tests(tests: str | None, entry_point: str | None) -> str | list:
    """The prompt's tests, checked so that they can fail; raises BadTests otherwise.

    Accepted: a JSON list of assert statements (statements without an assert run as
    setup), a JSON list of {"input", "output"} objects (stdin/stdout), or test code.
    """
    if tests is None or not tests.strip():
        raise BadTests("no tests for this prompt")
    try:
        parsed = json.loads(tests)
    except json.JSONDecodeError:
        parsed = tests
    if isinstance(parsed, str):
        tree = _syntax(parsed, "the test code")
        defines_check = any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "check"
            for n in tree.body
        )
        if defines_check and not entry_point:
            raise BadTests(
                "the tests define check(candidate) but the prompt's meta has no entry_point, "
                "so check would never be called"
            )
        if not _asserts(tree):
            raise BadTests("the tests assert nothing")
        return parsed
    if not isinstance(parsed, list):
        raise BadTests(f"malformed tests: a JSON {type(parsed).__name__}, not a list or code")
    if not parsed:
        raise BadTests("the test list is empty")
    if all(isinstance(t, dict) for t in parsed):
        for i, t in enumerate(parsed, 1):
            if not (isinstance(t.get("input"), str) and isinstance(t.get("output"), str)):
                raise BadTests(f"malformed stdin/stdout test {i}: needs string input and output")
        return parsed
    if not all(isinstance(t, str) for t in parsed):
        raise BadTests("malformed tests: a list must hold only strings or only objects")
    trees = [_syntax(t, f"test {i}") for i, t in enumerate(parsed, 1)]
    if not any(_asserts(t) for t in trees):
        raise BadTests("the tests assert nothing")
    return parsed


def build_job(
    text: str,
    prompt: str | None,
    tests: str | None,
    meta: str | None,
    isolation: str = "referee",
) -> Job:
    """A sandbox job from a candidate and its prompt's tests; raises BadTests.

    With `entry_point` in the prompt's meta, test code defining `check(candidate)` is
    called on that function, and a candidate that does not define the entry point is
    taken as a completion of the prompt (HumanEval style) and appended to it.
    """
    entry = None
    if meta:
        try:
            entry = json.loads(meta).get("entry_point")
        except (json.JSONDecodeError, AttributeError):
            entry = None
    parsed = parse_tests(tests, entry)
    code = extract_code(text)
    if entry and prompt and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        code = prompt + code
    return Job(code, parsed, entry, prompt, isolation)


class UnitTests(Verifier):
    """Run each candidate's code against its prompt's tests in sandboxes, many in parallel.

    Options: `timeout_s` (all of one candidate's tests), `test_timeout_s` (one test),
    `cpu_s`, `memory_mb`, `file_mb`, `max_procs`, `output_mb` (per candidate process),
    `abs_tol` / `rel_tol` (numbers in stdin/stdout output), `isolation` ("referee", the
    default: tests run in a referee process the code cannot reach; "shared": tests run in
    the candidate's own process, needed for tests that touch its objects, and forgeable),
    `workers` (sandboxes at once; default: CPU count), `min_score` (the share of tests a
    pass needs; default 1: all), `tests` ("strengthened": the verifying stage gives it each
    prompt's latest strengthened tests, column `tests_suite`). The score is the share of
    tests passed: of an assert list or a stdin/stdout list; test code with
    `check(candidate)` is one test, all or nothing.
    """

    name = "code"
    uses_reference = True
    # 2: the score is the share of tests passed (stdin/stdout tests all run); min_score
    version = 2
    operational = frozenset({"workers"})

    class Options(Verifier.Options):
        # the defaults are Limits' own
        timeout_s: float = Field(10.0, gt=0, description="all of one candidate's tests")
        test_timeout_s: float | None = Field(None, gt=0, description="one test (default: all)")
        cpu_s: int = Field(10, ge=1, description="CPU seconds per candidate process")
        memory_mb: int = Field(1024, ge=1, description="address space per candidate process")
        file_mb: int = Field(16, ge=0, description="largest file a candidate may write")
        max_procs: int = Field(32, ge=1, description="processes in the sandbox")
        tmp_mb: int = Field(64, ge=1, description="size of the sandbox's /tmp")
        output_mb: float = Field(16.0, gt=0, description="a program's output or one value")
        abs_tol: float = Field(0.0, ge=0, description="stdin/stdout numbers: absolute tolerance")
        rel_tol: float = Field(0.0, ge=0, description="stdin/stdout numbers: relative tolerance")
        isolation: Literal["referee", "shared", "judge"] = Field(
            "referee",
            description="referee: tests run where the code cannot reach ('judge': "
            "its former name); shared: in the candidate's process, forgeable",
        )
        workers: int | None = Field(None, ge=1, description="sandboxes at once (default: CPUs)")
        min_score: float = Field(
            1.0, gt=0, le=1, description="share of tests to pass (partial credit below 1)"
        )
        tests: Literal["original", "strengthened"] = Field(
            "original",
            description="strengthened: the prompt's latest tests from `thresher tests-audit` "
            "(its original tests where it has none, said in the reason)",
        )

    @classmethod
    def tests_suite(cls, options: UnitTests.Options) -> str:
        """The suite of tests its `tests` option names."""
        return options.tests

    @classmethod
    def prepare_rows(
        cls, lake: Lake, rows: pl.DataFrame, options: UnitTests.Options
    ) -> pl.DataFrame:
        """The rows with each prompt's latest strengthened tests where `tests` asks for them."""
        if options.tests != "strengthened":
            return rows

        return with_strengthened_tests(lake, rows)

    def __init__(
        self,
        workers: int | None = None,
        isolation: str = "referee",
        min_score: float = 1.0,
        tests: str = "original",
        **limits,
    ):
        isolation = FORMER_ISOLATIONS.get(isolation, isolation)
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.limits = Limits(**limits)
        self.workers = workers
        self.isolation = isolation
        self.min_score = min_score
        self.suite = tests

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text; prompt, tests, meta if present)."""
        rows = batch.to_dicts()
        verdicts = [Verdict(0.0, False, "")] * len(rows)
        elapsed = [0.0] * len(rows)
        jobs, index = [], []
        for i, row in enumerate(rows):
            try:
                jobs.append(
                    build_job(
                        row["text"],
                        row.get("prompt"),
                        row.get("tests"),
                        row.get("meta"),
                        self.isolation,
                    )
                )
                index.append(i)
            except BadTests as e:
                verdicts[i] = Verdict(0.0, False, str(e))
        for i, outcome in zip(index, run_jobs(jobs, self.limits, self.workers), strict=True):
            verdicts[i] = self._verdict(outcome)
            if self.suite == "strengthened" and rows[i].get("tests_suite") != "strengthened":
                v = verdicts[i]
                why = f"{v.reason} (no strengthened tests for this prompt: its original tests)"
                verdicts[i] = Verdict(v.score, v.passed, why)
            elapsed[i] = outcome.elapsed_ms
        return verdict_frame(self.name, batch["candidate_id"].to_list(), verdicts, elapsed)

    def _verdict(self, outcome) -> Verdict:
        """Score: the share of tests passed; passed: all of them (or min_score of them)."""
        score = outcome.score
        reason = outcome.reason
        if self.min_score >= 1 or outcome.passed:
            return Verdict(score, outcome.passed, reason)
        partial = outcome.tests_total is not None and score >= self.min_score
        if partial:
            reason = f"{score:.2f} of the tests passed (min_score {self.min_score:g}): {reason}"
        return Verdict(score, partial, reason)
