"""The plan of one run (a curate run or an evaluation), made once from its config: its
identities, what its candidates are, and each verifier's name, typed options, digest and
traits. Stages are called as `run(lake, plan, section, batch)`: their own config section,
this plan and a `Batch`; nothing downstream recomputes an identity or reads an option by
name."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from thresher.identities import (
    batch_id,
    digests_of,
    eval_run_id,
    run_id_for,
    sampling_params,
    selection_id_for,
    verifier_digests,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from thresher.config import CurateConfig, EvalConfig, TeacherConfig, VerifyConfig
    from thresher.verifiers.base import HeldOutRole, Verifier


@dataclass(frozen=True)
class VerifierPlan:
    """One verifier of a run: as the config names it, its class (whose hooks stages call),
    its options (as given and typed), the digest of its verdicts, its traits and its part
    in held-out evaluation."""

    name: str
    verifier: type[Verifier]
    given: dict[str, Any]
    options: BaseModel
    digest: str
    version: int
    uses_device: bool
    ranks: bool
    groups: bool
    uses_reference: bool
    reads_tool_output: bool
    operational: frozenset[str]
    held_out_role: HeldOutRole | None


@dataclass(frozen=True)
class Batch:
    """What one stage call works on: a batch's prompt rows, the candidates sampled for them
    so far and how many candidates each prompt gets (None: the plan's k)."""

    prompts: list[dict] = field(default_factory=list)
    candidate_ids: list[str] = field(default_factory=list)
    ks: dict[str, int] | None = None


@dataclass(frozen=True)
class StagePlan:
    """What every stage of a run reads besides its own section: the run's id and round,
    the rule and verifiers that judge its candidates, and what its candidates are."""

    run_id: str | None
    round: int
    rule: str | None
    verifiers: tuple[VerifierPlan, ...]
    tests_suite: str = "original"  # the tests the code verifier runs (a strength's suite)
    model_id: str = ""  # what the candidates' `model` column records
    params: dict[str, Any] = field(default_factory=dict)  # what makes a candidate what it is
    k: int = 1  # candidates per prompt, unless a batch says otherwise
    executor: str = "local"  # where verification runs (local, ray)
    ray: Any = None  # the RayConfig when it runs on a cluster

    @property
    def digests(self) -> dict[str, str]:
        """verifier -> the digest of the verdicts this run reads."""
        return {v.name: v.digest for v in self.verifiers}

    @property
    def ranking(self) -> list[str]:
        """The verifiers whose score ranks candidates (the `top_score` policy)."""
        return [v.name for v in self.verifiers if v.ranks]

    def batch_id(self, batch: Batch, hinted: bool = False) -> str:
        """The id of a batch's sampling in this run."""
        return batch_id(self.run_id, [p["prompt_id"] for p in batch.prompts], hinted)


@dataclass(frozen=True)
class RoundPlan(StagePlan):
    """A curate run: what every stage reads, its selection's id and the hinted share."""

    selection_id: str = ""
    max_hinted_share: float | None = None  # rationalization's cap on hinted candidates


@dataclass(frozen=True)
class EvalPlan(StagePlan):
    """A held-out evaluation: what every stage reads and the k's of its pass@k (each
    prompt is sampled `k` times: the evaluation's n)."""

    ks: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class TrainPlan:
    """A training run: its id (its settings and exact rows), the model it starts from and
    the folder it writes."""

    run_id: str
    base_model: str
    out_dir: str


def plan_curate(cfg: CurateConfig) -> RoundPlan:
    """The plan of a curate run of `cfg`."""
    return RoundPlan(
        run_id=run_id_for(cfg),
        selection_id=selection_id_for(cfg),
        max_hinted_share=hinted_share(cfg),
        k=cfg.sampling.k,
        **_shared(cfg, verifier_digests(cfg)),
    )


def hinted_share(cfg: CurateConfig) -> float | None:
    """The most hinted candidates may be of what a batch keeps: the smaller cap of the
    hints in use (the reference answer, part of a solution); None without hints."""
    caps = [h.max_share for h in (cfg.rationalize, cfg.hints) if h.enabled]
    caps = [c for c in caps if c is not None]
    return min(caps) if caps else None


def plan_teacher(cfg: CurateConfig, plan: RoundPlan, teacher: TeacherConfig) -> RoundPlan:
    """The plan a teacher of curate run `cfg` samples under: the run's, with the teacher's
    model and sampling (its candidates' ids say who made them)."""
    taught = cfg.teacher_config(teacher)
    params = sampling_params(taught) | {"source": teacher_source(teacher)}
    if teacher.template != "{prompt}":
        params["template"] = teacher.template
    return replace(plan, model_id=taught.model_id, params=params, k=teacher.k)


def teacher_source(teacher: TeacherConfig) -> str:
    """The `source` a teacher's candidates record: teacher:<name>."""
    return f"teacher:{teacher.name}"


def plan_eval(cfg: EvalConfig, opening: int | None = None) -> EvalPlan:
    """The plan of an evaluation of `cfg` (`opening`: which opening of the sealed test
    split a final evaluation is)."""
    if cfg.n > 1 and cfg.sampling.temperature == 0:
        raise ValueError("n > 1 samples need a temperature above 0")
    return EvalPlan(
        run_id=eval_run_id(cfg, opening),
        k=cfg.n,
        ks=tuple(cfg.ks),
        **_shared(cfg, digests_of(cfg.verify, cfg.n)),
    )


def _shared(cfg: CurateConfig | EvalConfig, digests: dict[str, str]) -> dict[str, Any]:
    """What a curate run's plan and an evaluation's take alike from their configs."""
    verifiers = verifier_plans(cfg.verify, digests)
    return dict(
        round=cfg.round,
        rule=cfg.verify.rule,
        verifiers=verifiers,
        tests_suite=tests_suite(verifiers),
        model_id=cfg.model_id,
        params=sampling_params(cfg),
        executor=cfg.executor,
        ray=cfg.ray,
    )


def verifier_plans(verify: VerifyConfig, digests: dict[str, str]) -> tuple[VerifierPlan, ...]:
    """Each verifier of `verify`, with its class, typed options, the digest of its verdicts
    and its traits."""
    from thresher.verifiers import traits, verifier_class  # local: layering (see test_layers.py)

    specs = []
    for name in verify.all_names():
        cls = verifier_class(name)
        given = verify.options.get(name) or {}
        specs.append(
            VerifierPlan(
                name=name,
                verifier=cls,
                given=given,
                options=cls.Options.model_validate(given),
                digest=digests[name],
                held_out_role=cls.held_out_role(),
                **traits(name),
            )
        )
    return tuple(specs)


def tests_suite(verifiers: tuple[VerifierPlan, ...]) -> str:
    """The tests these verifiers judge code by: the suite the first one that runs tests
    names (`Verifier.tests_suite`), else the original tests."""
    suites = (v.verifier.tests_suite(v.options) for v in verifiers)
    return next((s for s in suites if s is not None), "original")
