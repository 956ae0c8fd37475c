"""The `reasoning_gym` verifier: a procedural task's own scorer judges the final answer
against the entry the prompt was generated from (kept in the prompt's meta at ingest)."""

from __future__ import annotations

import json
import time
from typing import Any

import polars as pl
from pydantic import Field

from thresher.verifiers.base import Verdict, Verifier, quote, verdict_frame
from thresher.verifiers.extract import extract_answer as find_answer
from thresher.verifiers.math_workers import check_in_workers

_SCORERS: dict[str, Any] = {}  # (generator, config) -> its dataset, in a worker process


def entry_of(meta: Any) -> dict | None:
    """The prompt's reasoning-gym record (generator, config, entry), or None."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if not isinstance(meta, dict) or not isinstance(meta.get("entry"), dict):
        return None
    if not isinstance(meta.get("generator"), str):
        return None
    return meta


def final_answer(text: str) -> tuple[str | None, str]:
    """(answer, how it was found): the last <answer> tags, else thresher's answer finding."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text or "")
    if tagged is not None:
        return tagged, "<answer> tags"
    answer, how = find_answer(text or "")
    return answer, f"no <answer> tags; thresher's answer finding ({how})"


def scorer(generator: str, config: dict) -> Any:
    """The task's dataset, whose `score_answer(answer, entry)` is its own scorer."""
    key = json.dumps([generator, config], sort_keys=True)
    if key not in _SCORERS:
        import reasoning_gym

        _SCORERS[key] = reasoning_gym.create_dataset(generator, size=1, seed=0, **config)
    return _SCORERS[key]


def score_in_worker(job: dict) -> Verdict:
    """One candidate's verdict (runs in a verifier worker, under its deadline)."""
    generator, min_score = job["generator"], job["min_score"]
    try:
        answer, how = final_answer(job["text"])
    except ImportError:
        return Verdict(0.0, False, "cannot judge: reasoning-gym is not installed")
    if answer is None:
        return Verdict(0.0, False, "no answer found (no <answer> tags, no final answer)")
    try:
        dataset = scorer(generator, job["config"])
    except Exception as e:
        return Verdict(0.0, False, f"cannot judge: {generator} did not load: {_error(e)}")
    try:
        score = float(dataset.score_answer(answer, job["entry"]))
    except Exception as e:  # a scorer that raises on odd input: a failed verdict
        why = f"{how}: {quote(answer)}: {generator}'s scorer raised {_error(e)}"
        return Verdict(0.0, False, why, answer)
    passed = score >= min_score
    said = f"{how}: {quote(answer)} scored {score:g} by {generator}'s scorer"
    why = said + ("" if passed else f" (passing needs {min_score:g})")
    return Verdict(score, passed, why, answer)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {quote(e, 120)}"


class ReasoningGym(Verifier):
    """The task's own reasoning-gym scorer on the final answer; passes at `min_score`.

    Options: `min_score` (default 1.0: reasoning-gym's partial credit is not a pass),
    `timeout_s` (per candidate, a hard limit: scorers run in the math verifier's workers).
    """

    name = "reasoning_gym"
    uses_reference = True
    # 2: the last number without a comma after it ("6, which ..." reads 6); 3: "X is the
    # final answer" reads X
    version = 3

    class Options(Verifier.Options):
        min_score: float = Field(1.0, ge=0, le=1, description="lowest score that passes")
        timeout_s: float = Field(10, gt=0, description="per candidate (a hard limit)")

    def __init__(self, min_score: float = 1.0, timeout_s: float = 10):
        self.min_score, self.timeout_s = min_score, timeout_s

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, meta)."""
        metas = batch["meta"].to_list() if "meta" in batch.columns else [None] * batch.height
        results: list[tuple[Verdict, float] | None] = []
        jobs, where = [], []
        for i, (text, meta) in enumerate(zip(batch["text"].to_list(), metas, strict=True)):
            start = time.perf_counter()
            found = entry_of(meta)
            if found is None:
                why = (
                    "cannot judge: the prompt's meta has no reasoning-gym entry (ingest it "
                    "with `thresher ingest --from reasoning-gym`)"
                )
                results.append((Verdict(0.0, False, why), (time.perf_counter() - start) * 1000))
                continue
            results.append(None)
            where.append(i)
            jobs.append(
                {
                    "kind": "reasoning_gym",
                    "text": text or "",
                    "generator": found["generator"],
                    "config": found.get("config") or {},
                    "entry": found["entry"],
                    "min_score": self.min_score,
                }
            )
        if jobs:
            for i, result in zip(where, check_in_workers(jobs, self.timeout_s), strict=True):
                results[i] = result
        verdicts = [v for v, _ in results]  # type: ignore[misc]
        elapsed = [ms for _, ms in results]  # type: ignore[misc]
        return verdict_frame(self.name, batch["candidate_id"].to_list(), verdicts, elapsed)
