"""thresher's verifiers as RL reward functions: one with TRL's reward-function signature
(completions and the dataset's columns as keyword arguments, floats back) and verl's custom
`compute_score`, each judging a batch at once with the verifiers a row names.

A row of `thresher export --format rl` carries what its verifiers need: the question, the
reference (`answer`), `tests`, `meta` (a reasoning-gym entry) and `verifiers` (JSON: the
names and options of the curate config that measured its pass rate). The verifiers keep
their own time-outs (the sandbox's per test, the math workers' per answer), so a candidate
that hangs costs the trainer at most that and scores 0 with the reason saying why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from thresher.verifiers import get_verifier

DEFAULT_SPEC = {"verifiers": ["math"], "options": {}}


def completion_text(completion: Any) -> str:
    """A completion as text: TRL gives a string, or for chat data a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return "" if completion is None else str(completion)


def _spec(value: Any) -> dict:
    if value is None:
        return DEFAULT_SPEC
    spec = json.loads(value) if isinstance(value, str) else dict(value)
    return {"verifiers": spec.get("verifiers") or ["math"], "options": spec.get("options") or {}}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def score_rows(rows: list[dict], spec: dict) -> list[tuple[float, bool, str]]:
    """(score, passed, reason) per row (completion text, question, answer, tests, meta, task) by
    the spec's verifiers: one verifier's score as it is, several: 1.0 when all pass."""
    import polars as pl

    if not rows:
        return []
    names, options = spec["verifiers"], spec["options"]
    batch = pl.DataFrame(
        {
            "candidate_id": [f"c{i}" for i in range(len(rows))],
            "prompt_id": [str(r.get("prompt_id") or f"p{i}") for i, r in enumerate(rows)],
            "text": [r["text"] for r in rows],
            "prompt": [r.get("question") for r in rows],
            "messages": [None] * len(rows),
            "task": [r.get("task") for r in rows],
            "answer": [None if r.get("answer") is None else str(r["answer"]) for r in rows],
            "tests": [_text(r.get("tests")) for r in rows],
            "meta": [_text(r.get("meta")) for r in rows],
        },
        schema={k: pl.String for k in ("candidate_id", "prompt_id", "text", "prompt", "messages",
                                        "task", "answer", "tests", "meta")},
    )  # fmt: skip
    frames = [get_verifier(n, options.get(n)).run(batch) for n in names]
    out = []
    for i in range(len(rows)):
        verdicts = [f.row(i, named=True) for f in frames]
        if len(verdicts) == 1:
            v = verdicts[0]
            out.append((float(v["score"]), bool(v["passed"]), f"{names[0]}: {v['reason']}"))
            continue
        passed = all(v["passed"] for v in verdicts)
        reason = "; ".join(f"{n}: {v['reason']}" for n, v in zip(names, verdicts, strict=True))
        out.append((1.0 if passed else 0.0, passed, reason))
    return out


def _score_grouped(rows: list[dict], specs: list[dict]) -> list[tuple[float, bool, str]]:
    """Rows judged in one batch per distinct verifier spec, results in row order."""
    out: list[tuple[float, bool, str] | None] = [None] * len(rows)
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(json.dumps(spec, sort_keys=True), []).append(i)
    for key, idx in groups.items():
        for i, got in zip(idx, score_rows([rows[i] for i in idx], json.loads(key)), strict=True):
            out[i] = got
    return [o for o in out if o is not None]


def reward_function(
    verifiers: Sequence[str] | None = None, options: dict[str, dict] | None = None
) -> Callable[..., list[float]]:
    """A reward function for TRL's GRPOTrainer: `f(completions, **columns) -> floats`.

    With `verifiers`, every row is judged by them (`options` per verifier); without, each
    row by its own `verifiers` column (as `export --format rl` writes it). The verdicts'
    reasons go to TRL's completions table (`log_extra`) as the column `thresher_reason`."""
    fixed = None if verifiers is None else {"verifiers": list(verifiers), "options": options or {}}

    def thresher_reward(
        completions: list, prompts: list | None = None, **columns: Any
    ) -> list[float]:
        log_extra = columns.pop("log_extra", None)
        n = len(completions)

        def column(name: str) -> list:
            value = columns.get(name)
            return list(value) if value is not None else [None] * n

        questions = column("question")
        if prompts is not None:
            questions = [q if q is not None else completion_text(p[-1:] if isinstance(p, list)
                         else p) for q, p in zip(questions, prompts, strict=True)]  # fmt: skip
        rows = [
            {"text": completion_text(c), "question": q, "answer": a, "tests": t, "meta": m,
             "task": k, "prompt_id": pid}
            for c, q, a, t, m, k, pid in zip(
                completions, questions, column("answer"), column("tests"), column("meta"),
                column("task"), column("prompt_id"), strict=True,
            )
        ]  # fmt: skip
        specs = [fixed or _spec(s) for s in column("verifiers")]
        scored = _score_grouped(rows, specs)
        if callable(log_extra):
            log_extra("thresher_reason", [reason for _, _, reason in scored])
        return [score for score, _, _ in scored]

    thresher_reward.__name__ = "thresher_" + ("_".join(verifiers) if verifiers else "reward")
    return thresher_reward


def compute_score(
    data_source: Any = None,
    solution_str: str | None = None,
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **batch: Any,
) -> dict | list[dict]:
    """verl's custom reward function (`custom_reward_function.path` this file's module,
    `name: compute_score`): {"score", "passed", "reason"} for one solution, or with verl's
    batch reward manager (data_sources, solution_strs, ground_truths, extra_infos) a list
    of them. The verifiers and the reference come from `extra_info` (as `export --format
    rl` writes it); without one, `ground_truth` is the reference and `math` judges."""
    if "solution_strs" in batch:
        sols = list(batch["solution_strs"])
        truths = list(batch.get("ground_truths") or [None] * len(sols))
        infos = list(batch.get("extra_infos") or [None] * len(sols))
    else:
        sols, truths, infos = [solution_str], [ground_truth], [extra_info]
    rows, specs = [], []
    for sol, truth, info in zip(sols, truths, infos, strict=True):
        info = dict(info or {})
        answer = info.get("answer", truth if info.get("tests") is None else None)
        rows.append(
            {"text": sol or "", "question": info.get("question"), "answer": answer,
             "tests": info.get("tests"), "meta": info.get("meta"), "task": info.get("task"),
             "prompt_id": info.get("prompt_id")}
        )  # fmt: skip
        specs.append(_spec(info.get("verifiers")))
    out = [
        {"score": score, "passed": passed, "reason": reason}
        for score, passed, reason in _score_grouped(rows, specs)
    ]
    return out if "solution_strs" in batch else out[0]
