"""What identifies each stage's output: exactly what determines it, nothing else.

A candidate's id is its prompt, model, round, sample index and sampling parameters
(samplers.candidate_id); a verdict's, its candidate, verifier and that verifier's options
digest; a selection's, everything selection depends on; an evaluation's, the model, prompts,
n, k's and verifiers; a training run's, its settings and a digest of its exact rows. A
changed setting changes the identity of the stages it touches, so only they run again.
Run ids (what a re-run resumes) leave out where and how fast the work runs.
"""

from __future__ import annotations

from typing import Any

from thresher.config import (
    GATE_SETTINGS,
    BootstrapConfig,
    CurateConfig,
    EvalConfig,
    TrainConfig,
)
from thresher.ids import content_id


def sampling_params(cfg: CurateConfig) -> dict[str, Any]:
    """The parameters that make a candidate what it is (k is not: raising k tops up)."""
    return cfg.sampling.model_dump(exclude={"k"})


# Where and how fast the work runs, not what it produces.
OPERATIONAL = {"lake", "batch_size", "engine", "timeout_s", "executor", "ray", "compact"}


def without_gates(names: set[str]) -> dict[str, Any]:
    """model_dump's `exclude` for these top-level fields and the gate settings
    (config.GATE_SETTINGS: they decide whether a run may go on, not what it makes)."""
    return {**dict.fromkeys(names, True), **GATE_SETTINGS}


def run_id_for(cfg: CurateConfig) -> str:
    """Same pipeline settings, same run: re-running resumes it."""
    return content_id("curate", cfg.model_dump(exclude=without_gates(OPERATIONAL)))


def verifier_digests(cfg: CurateConfig) -> dict[str, str]:
    """verifier -> the digest of its version and options: which verdicts the run reads.

    A verifier that judges a prompt's candidates together (`majority`) also has what
    decides how many a prompt has (k, difficulty): with a larger k every candidate of the
    prompt is judged again among all of them, so old and new verdicts cannot disagree."""
    from thresher.verifiers import options_digest, traits

    v = cfg.verify
    digests = {}
    for name in v.all_names():
        digest = options_digest(name, v.options.get(name))
        if traits(name)["groups"]:
            group = {"k": cfg.sampling.k, "difficulty": cfg.difficulty.model_dump()}
            digest = content_id("group-verdicts", digest, group)
        digests[name] = digest
    return digests


def selection_id_for(cfg: CurateConfig) -> str:
    """Everything a selection depends on: its candidates (prompts, model, round, sampling,
    difficulty, rationalization), the verdicts it reads and the select settings."""
    v = cfg.verify
    return content_id(
        "selection",
        cfg.name,
        cfg.model_id,
        cfg.round,
        cfg.prompts.model_dump(),
        cfg.sampling.model_dump(),
        cfg.difficulty.model_dump(),
        cfg.rationalize.model_dump(),
        cfg.select.model_dump(exclude=GATE_SETTINGS["select"]),
        {"verifiers": v.verifiers, "by_task": v.by_task, "rule": v.rule},
        verifier_digests(cfg),
    )


def plain_ids(cfg: CurateConfig, prompt_ids: list[str], ks: dict[str, int]) -> list[str]:
    """The unhinted candidate ids of these prompts: indices 0..k-1 of each."""
    from thresher.samplers import expected_ids

    return expected_ids(prompt_ids, cfg.model_id, cfg.round, ks, sampling_params(cfg))


def hinted_ids(cfg: CurateConfig, prompt_ids: list[str]) -> list[str]:
    """Every id a rationalization of these prompts could produce (most do not exist)."""
    from thresher.samplers import expected_ids

    r = cfg.rationalize
    if not r.enabled:
        return []
    params = {**sampling_params(cfg), "hint": r.hint}
    return expected_ids(prompt_ids, cfg.model_id, cfg.round, r.k, params)


def eval_run_id(cfg: EvalConfig) -> str:
    """What determines the metrics: the model, the prompts, how they are sampled (n), the
    verifiers with their options and rule, the k's (and the pipeline name, for reports)."""
    cur = cfg.as_curate()
    return content_id(
        "evaluate",
        cfg.name,
        cur.model_id,
        cfg.round,
        cfg.prompts.model_dump(),
        cfg.n,
        sorted(cfg.ks),
        sampling_params(cur),
        {"verifiers": cfg.verify.verifiers, "by_task": cfg.verify.by_task},
        cfg.verify.rule,
        verifier_digests(cur),
    )


def rows_digest(rows: list[dict]) -> str:
    """A digest of the exact training rows, in order."""
    return content_id("rows", rows)


def train_run_id(cfg: TrainConfig, rows: list[dict]) -> str:
    """Same training settings and the same rows, same run: re-running resumes (or skips)
    it; new data (more prompts curated, another selection) is a new run.

    The process count is not part of it: batch_size is the global batch whatever it is,
    and a run may resume with another one."""
    return content_id("train", cfg.model_dump(exclude={"lake", "distributed"}), rows_digest(rows))


def bootstrap_run_id(cfg: BootstrapConfig) -> str:
    """The stop rules and the audit gate are not part of the run: raising max_rounds
    continues it, and a round stopped at the gate resumes once it passes."""
    stops = {"max_rounds", "min_gain", "patience", "audit"}
    return content_id(
        "bootstrap",
        cfg.model_dump(exclude=without_gates(OPERATIONAL | stops)),
    )
