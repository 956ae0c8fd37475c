"""What identifies each stage's output: exactly what determines it, nothing else.

A candidate's id is its prompt, model, round, sample index and sampling parameters
(samplers.candidate_id); a verdict's, its candidate, verifier and that verifier's options
digest; a selection's, everything selection depends on; an evaluation's, the model, prompts,
n, k's and verifiers; a training run's, its settings and a digest of its exact rows. A
changed setting changes the identity of the stages it touches, so only they run again.
Run ids (what a re-run resumes) leave out where and how fast the work runs.
"""

from __future__ import annotations

from thresher.config import BootstrapConfig, CurateConfig, EvalConfig, TrainConfig
from thresher.ids import content_id
from thresher.samplers import sampling_params
from thresher.verifiers.stage import verifier_digests

# Where and how fast the work runs, not what it produces.
OPERATIONAL = {"lake", "batch_size", "engine", "timeout_s", "executor", "ray", "compact"}


def without_gates(names: set[str]) -> set[str]:
    """model_dump's `exclude` for these top-level fields and the `gates` section (gates
    decide whether a run may go on, not what it makes)."""
    return names | {"gates"}


def _settings(cfg: CurateConfig | BootstrapConfig, exclude: set[str]) -> dict:
    """The config's fields less `exclude` and the gates, with the difficulty settings that
    decide what is sampled (those that only report are left out)."""
    out = cfg.model_dump(exclude=without_gates(exclude))
    out["difficulty"] = cfg.difficulty.identity()
    return out


def run_id_for(cfg: CurateConfig) -> str:
    """Same pipeline settings, same run: re-running resumes it."""
    return content_id("curate", _settings(cfg, OPERATIONAL))


def selection_id_for(cfg: CurateConfig) -> str:
    """Everything a selection depends on: its candidates (prompts, model, round, sampling,
    difficulty, rationalization), the verdicts it reads and the select settings."""
    verify = cfg.verify
    return content_id(
        "selection",
        cfg.name,
        cfg.model_id,
        cfg.round,
        cfg.prompts.model_dump(),
        cfg.sampling.model_dump(),
        cfg.difficulty.identity(),
        cfg.rationalize.model_dump(),
        cfg.select.model_dump(),
        {"verifiers": verify.verifiers, "by_task": verify.by_task, "rule": verify.rule},
        verifier_digests(cfg),
    )


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
    and a run may resume with another one; nor is packing, which lays the same examples out
    in fewer rows (the same loss and gradients)."""
    settings = cfg.model_dump(exclude={"lake", "distributed", "packing"})
    return content_id("train", settings, rows_digest(rows))


def bootstrap_run_id(cfg: BootstrapConfig) -> str:
    """The stop rules and the gates (audit, monitors, forgetting checks) are not part of the
    run: raising max_rounds continues it, and a round stopped at a gate resumes once it
    passes."""
    stops = {"max_rounds", "min_gain", "patience", "audit", "monitors"}
    settings = _settings(cfg, OPERATIONAL | stops)
    # forgetting checks measure and may stop; each is an evaluation with its own id
    settings["eval"].pop("also", None)
    settings["train"].pop("packing", None)  # the rows' layout, not what is trained
    return content_id("bootstrap", settings)
