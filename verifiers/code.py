"""The `code` verifier: the candidate's code passes the prompt's unit tests in a sandbox."""

from __future__ import annotations

import json
import re

import polars as pl

from thresher.verifiers.base import Verdict, verdict_frame
from thresher.verifiers.sandbox import Job, Limits, run_jobs

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last fenced code block, else the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def build_job(text: str, prompt: str | None, tests: str | None, meta: str | None) -> Job | None:
    """A sandbox job from a candidate and its prompt's tests; None when there are no tests.

    `tests` is a JSON list of assert statements, or test code; with `entry_point` in the
    prompt's meta, test code defining `check(candidate)` is called on that function. A
    candidate that does not define the entry point is taken as a completion of the prompt
    (HumanEval style) and appended to it.
    """
    if not tests or not tests.strip():
        return None
    try:
        parsed = json.loads(tests)
    except json.JSONDecodeError:
        parsed = tests
    if isinstance(parsed, list):
        tests_value: str | list[str] = [str(t) for t in parsed]
    else:
        tests_value = tests
    entry = None
    if meta:
        try:
            entry = json.loads(meta).get("entry_point")
        except (json.JSONDecodeError, AttributeError):
            entry = None
    code = extract_code(text)
    if entry and prompt and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        code = prompt + code
    return Job(code, tests_value, entry)


class UnitTests:
    """Run each candidate's code with its prompt's tests in a sandbox, many in parallel.

    Options: `timeout_s`, `cpu_s`, `memory_mb`, `file_mb`, `max_procs` (per candidate),
    `workers` (sandboxes at once; default: CPU count).
    """

    name = "code"

    def __init__(self, workers: int | None = None, **limits):
        self.limits = Limits(**limits)
        self.workers = workers

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        rows = batch.to_dicts()
        jobs, index = [], []
        for i, row in enumerate(rows):
            job = build_job(row["text"], row.get("prompt"), row.get("tests"), row.get("meta"))
            if job is not None:
                jobs.append(job)
                index.append(i)
        verdicts = [Verdict(0.0, False, "no tests for this prompt")] * len(rows)
        elapsed = [0.0] * len(rows)
        for i, outcome in zip(index, run_jobs(jobs, self.limits, self.workers), strict=True):
            verdicts[i] = Verdict(float(outcome.passed), outcome.passed, outcome.reason)
            elapsed[i] = outcome.elapsed_ms
        return verdict_frame(self.name, batch["candidate_id"].to_list(), verdicts, elapsed)
