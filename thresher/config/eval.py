"""The evaluation sections: held-out pass@k of one model, and of every round's model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from thresher.config.base import _Strict, never
from thresher.config.curate import SEALED
from thresher.config.engine import EngineStage, PromptsConfig, model_id
from thresher.config.verify import VerifyConfig


class HeldOut(_Strict):
    """What a held-out evaluation measures: its prompts, n samples each, pass@k for ks."""

    counted_at_default = frozenset({"prompts", "n", "ks"})

    prompts: PromptsConfig
    n: int = Field(8, ge=1, description="samples per prompt")
    ks: list[int] = Field(default_factory=lambda: [1, 8], min_length=1)

    @model_validator(mode="after")
    def _ks_fit(self) -> HeldOut:
        if max(self.ks) > self.n:
            raise ValueError(f"pass@{max(self.ks)} needs n >= {max(self.ks)} samples per prompt")
        return self


class EvalConfig(EngineStage, HeldOut):
    """Held-out evaluation: n samples per prompt, verified, summarised as pass@k."""

    counted_at_default = frozenset({"model", "lora", "round", "verify", "final"})

    name: str = "eval"
    model: str
    lora: str | None = None
    round: int = Field(0, ge=0, description="the round this model belongs to")
    verify: VerifyConfig = Field(default_factory=VerifyConfig.for_evaluation)
    final: bool = Field(
        False, description="open the sealed test split (each opening is recorded as a run)"
    )

    @model_validator(mode="after")
    def _test_only_when_final(self) -> EvalConfig:
        if (self.prompts.split == "test") != self.final:
            raise ValueError(
                SEALED if not self.final else "final evaluations are of the test split"
            )
        return self

    @model_validator(mode="after")
    def _verifiers_accept(self) -> EvalConfig:
        self.verify.check_pipeline(self)
        return self

    @property
    def model_id(self) -> str:
        """What the `model` column records: the model, plus the adapter when there is one."""
        return model_id(self.model, self.lora)

    @property
    def placement(self) -> Literal["local", "ray"]:
        """Where sampling runs: the executor's engines (an evaluation has no server)."""
        return self.executor

    @property
    def server(self) -> None:
        """An evaluation samples with its own engines, never a server."""
        return None


class ForgettingCheckConfig(_Strict):
    """Another held-out set evaluated every round beside the main one: a skill the rounds
    must not cost (general knowledge, another task), measured against the base model."""

    dataset: str
    split: Literal["train", "eval", "test"] = Field(
        "eval", description="a split the bootstrap does not train on (test is sealed)"
    )
    task: str | None = Field(None, description="only prompts of this task")
    limit: int | None = Field(None, ge=1, description="at most this many prompts")
    verify: VerifyConfig | None = Field(
        None, description="its verifiers (default: those of the main held-out evaluation)"
    )
    max_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="stop the run when a round's model scores pass@1 lower than the base "
        "model by more than this (unset: measured and reported only)",
    )

    @model_validator(mode="after")
    def _not_sealed(self) -> ForgettingCheckConfig:
        if self.split == "test":
            raise ValueError(SEALED)
        return self

    def prompts(self) -> PromptsConfig:
        """The prompts it evaluates."""
        return PromptsConfig(
            dataset=self.dataset, split=self.split, task=self.task, limit=self.limit
        )

    def label(self) -> str:
        """e.g. 'general/eval' or 'arith/eval/add': how reports and messages name it."""
        return "/".join(p for p in (self.dataset, self.split, self.task) if p)


class BootstrapEvalConfig(HeldOut):
    """Held-out evaluation of every round's model."""

    counted_at_default = frozenset({"temperature", "top_p", "max_tokens", "verify"})

    temperature: float | None = Field(None, ge=0, description="default: sampling.temperature")
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    verify: VerifyConfig | None = Field(
        None,
        description="verifiers of the held-out metrics (and so of the stop rule, rollback "
        "and report); default: training's verifiers that check a reference (math, exact, "
        "choice, code, judge, reasoning_gym), every one of them passing (training's rule is "
        "not used)",
    )
    # forgetting checks measure and may stop; each is an evaluation with its own id
    also: list[ForgettingCheckConfig] = never(
        default_factory=list,
        description="more held-out sets evaluated every round (forgetting checks); a drop "
        "of pass@1 beyond max_drop against the base model stops the run",
    )

    @model_validator(mode="after")
    def _held_out_split(self) -> BootstrapEvalConfig:
        if self.prompts.split != "eval":
            raise ValueError("evaluation prompts must be an eval split (held out from training)")
        return self


def forgetting_name(pipeline: str, check: ForgettingCheckConfig) -> str:
    """The name a forgetting check's evaluations are filed under (apart from the main one)."""
    return f"{pipeline}{FORGETTING}{check.label()}"


FORGETTING = "~"  # between a pipeline's name and a forgetting check's label
