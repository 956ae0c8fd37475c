"""The plan of one curate run, made once from its config: its identities, and each
verifier's name, typed options, digest and traits. Stages take their own config section
and this plan; nothing downstream recomputes an identity or reads an option by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thresher.identities import run_id_for, selection_id_for, verifier_digests

if TYPE_CHECKING:
    from pydantic import BaseModel

    from thresher.config import CurateConfig


@dataclass(frozen=True)
class VerifierPlan:
    """One verifier of a run: as the config names it, its options (as given and typed),
    the digest of its verdicts and its traits."""

    name: str
    given: dict[str, Any]
    options: BaseModel
    digest: str
    uses_device: bool
    ranks: bool
    groups: bool
    uses_reference: bool


@dataclass(frozen=True)
class RoundPlan:
    """What a curate (or evaluation) run is: its ids, round, rule and verifiers."""

    run_id: str | None
    selection_id: str
    round: int
    rule: str | None
    verifiers: tuple[VerifierPlan, ...]
    tests_suite: str = "original"  # the tests the code verifier runs (a strength's suite)
    max_hinted_share: float | None = None  # rationalization's cap on hinted candidates

    @property
    def digests(self) -> dict[str, str]:
        """verifier -> the digest of the verdicts this run reads."""
        return {v.name: v.digest for v in self.verifiers}

    @property
    def ranking(self) -> list[str]:
        """The verifiers whose score ranks candidates (the `top_score` policy)."""
        return [v.name for v in self.verifiers if v.ranks]


def plan_curate(cfg: CurateConfig) -> RoundPlan:
    """The plan of a curate run of `cfg` (an evaluation's too, through its curate part)."""
    from thresher.verifiers import tests_suite, traits, verifier_class

    digests = verifier_digests(cfg)
    verify = cfg.verify
    specs = []
    for name in verify.all_names():
        given = verify.options.get(name) or {}
        t = traits(name)
        specs.append(
            VerifierPlan(
                name=name,
                given=given,
                options=verifier_class(name).Options.model_validate(given),
                digest=digests[name],
                uses_device=t["uses_device"],
                ranks=t["ranks"],
                groups=t["groups"],
                uses_reference=t["uses_reference"],
            )
        )
    rationalize = cfg.rationalize
    return RoundPlan(
        run_id=run_id_for(cfg),
        selection_id=selection_id_for(cfg),
        round=cfg.round,
        rule=verify.rule,
        verifiers=tuple(specs),
        tests_suite=tests_suite(verify.options),
        max_hinted_share=rationalize.max_share if rationalize.enabled else None,
    )
