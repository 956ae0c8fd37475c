"""The bootstrap pipeline's config: curate, train and eval sections, stop rules and gates."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from thresher.config.base import _Strict, never
from thresher.config.curate import CurateConfig, CurateSections, GatedStage
from thresher.config.env import EnvironmentConfig, round_dataset
from thresher.config.eval import BootstrapEvalConfig, EvalConfig, forgetting_name
from thresher.config.train import TrainConfig, TrainDataConfig, TrainSettings
from thresher.config.verify import VerifyConfig, verifiers_in_role


class BootstrapTrainConfig(TrainSettings):
    """Training in each round (the fields of a train config, without the pipeline ones)."""

    counted_at_default = frozenset({"all_rounds"})

    all_rounds: bool = Field(True, description="train on rounds 0..r's kept data (STaR)")

    @model_validator(mode="after")
    def _mix_keeps_the_rounds(self) -> BootstrapTrainConfig:
        if self.mix is not None and not any(s.is_self for s in self.mix):
            raise ValueError(
                "a bootstrap trains on its rounds' kept data: train.mix needs a "
                "`pipeline: self` source"
            )
        return self


class RollbackConfig(_Strict):
    """Sample the next round with the best model so far when the newest one regressed."""

    counted_at_default = frozenset({"enabled", "tolerance"})

    enabled: bool = True
    tolerance: float = Field(
        0.02,
        ge=0,
        description="a drop of held-out pass@1 below the best model's by more than this is "
        "a regression: the next round samples with the best model instead",
    )


class AuditGateConfig(_Strict):
    """Stop a bootstrap before training on a round whose verifiers are wrong too often,
    measured on labelled candidates of that round (`thresher audit check`)."""

    max_false_pass: float = Field(
        ge=0, le=1, description="most false-pass rate (passed among labelled incorrect)"
    )
    min_labels: int = Field(
        20, ge=1, description="a round with fewer labelled candidates stops (label it first)"
    )
    verifiers: list[str] = Field(
        default_factory=lambda: ["rule"],
        min_length=1,
        description="what is checked: rule (the selection rule) and/or verifier names",
    )
    sheet_size: int = Field(
        100, ge=1, description="candidates on the audit sheet written when the gate stops"
    )


def _share(description: str) -> Any:
    return Field(None, ge=0, le=1, description=description)


class MonitorsGateConfig(_Strict):
    """Stop a bootstrap before training on a round whose monitors (view round_monitors)
    show collapse or a gamed signal; every threshold is optional (unset: not checked)."""

    min_distinct_answers: float | None = Field(
        None, ge=0, description="least mean number of distinct final answers per prompt"
    )
    max_similarity: float | None = _share(
        "most mean pairwise MinHash similarity among a prompt's candidates"
    )
    max_repeated_opening_share: float | None = _share(
        "most share of prompts having a candidate open with the most repeated sentence"
    )
    max_repeated_closing_share: float | None = _share(
        "most share of prompts having a candidate close with the most repeated sentence"
    )
    max_length_drift: float | None = Field(
        None,
        ge=0,
        description="most distance from 1 of kept_length_ratio (median tokens of the kept "
        "candidates over that of all candidates)",
    )
    max_hinted_share: float | None = _share("most share of hinted candidates among the kept")
    min_headroom: float | None = Field(
        None,
        ge=0,
        le=1,
        description="least held-out pass@k - pass@1 (largest k) of the round's sampling model",
    )
    min_mixed_share: float | None = _share("least share of prompts solved sometimes, not always")
    max_answer_excess: float | None = _share(
        "most excess, in any task, of the kept candidates' top final answer's share over "
        "its share of the references (a loop collapsing onto one answer)"
    )


class FormatConfig(_Strict):
    """The asked answer format from a cold start: while the sampling model's held-out
    share of answers in the format (the evaluation's `format` metric) is below
    `min_compliance`, a round keeps correct answers outside the format (the verify rule
    without `answer_format`) and trains on them with the answer restated in the format."""

    tag: str = Field("answer", pattern=r"^[A-Za-z][\w-]*$", description="the asked tag")
    remedy: Literal["restate", "none"] = Field(
        "restate",
        description="restate: a kept answer outside the format ends with `<tag>answer</tag>` "
        "(marked `restated`); none: only answers in the format are kept, from round 0",
    )
    min_compliance: float = Field(
        0.5, ge=0, le=1, description="the format share at which rounds require the format"
    )


class BootstrapConfig(GatedStage, CurateSections):
    """Self-bootstrap rounds (STaR / RFT): round r samples the training prompts with
    model r, verifies, selects and trains model r+1, which is evaluated on held-out prompts.
    Its curate sections (prompts, verify, select, difficulty, rationalize) are a curate
    config's; `train` and `eval` are a train and an eval config's settings."""

    counted_at_default = frozenset({"base_model", "train", "eval", "rollback"})

    base_model: str = Field(description="local model folder: model 0")
    # stop rules and gates: raising max_rounds continues a run, and a round stopped at a gate
    # resumes once it passes
    max_rounds: int = never(default=3, ge=1, description="rounds to run (each trains one model)")
    min_gain: float = never(
        default=0.01, description="held-out pass@1 gain over the best earlier model that counts"
    )
    patience: int = never(
        default=2, ge=1, description="stop after this many rounds in a row without min_gain"
    )
    train: BootstrapTrainConfig = Field(default_factory=BootstrapTrainConfig)
    eval: BootstrapEvalConfig
    audit: AuditGateConfig | None = never(
        default=None,
        description="check each round's labelled false-pass rate before training on it",
    )
    monitors: MonitorsGateConfig | None = never(
        default=None,
        description="check each round's monitors against thresholds before training on it",
    )
    rollback: RollbackConfig = Field(default_factory=RollbackConfig)
    environment: EnvironmentConfig | None = Field(
        None,
        description="generate each round's training prompts (dataset <prompts.dataset>-round-"
        "<r>) instead of reading a fixed dataset",
    )
    format: FormatConfig | None = Field(
        None, description="the remedy for a model that does not yet answer in the asked format"
    )

    @model_validator(mode="after")
    def _format_is_judged(self) -> BootstrapConfig:
        if self.format is not None and not self.verify.in_role("asked_format"):
            names = " or ".join(verifiers_in_role("asked_format"))
            raise ValueError(f"format: needs the {names} verifier among verify.verifiers")
        if self.format is not None and self.verify.rule is not None:
            raise ValueError("format: needs the default verify rule (every verifier passes)")
        return self

    @model_validator(mode="after")
    def _headroom_measured(self) -> BootstrapConfig:
        if self.monitors and self.monitors.min_headroom is not None and max(self.eval.ks) < 2:
            raise ValueError("monitors.min_headroom needs a pass@k with k > 1 in eval.ks")
        return self

    @model_validator(mode="after")
    def _held_out_truth(self) -> BootstrapConfig:
        self.eval_verify()  # refuses an evaluation without a reference before anything runs
        trained = (self.prompts.dataset, self.prompts.split)
        for check in self.eval.also:
            if (check.dataset, check.split) == trained:
                raise ValueError(
                    f"eval.also {check.label()} is what the rounds train on: a forgetting "
                    "check needs prompts held out from training"
                )
            if check.verify is not None:
                check.verify.with_reference()
        labels = [c.label() for c in self.eval.also]
        if len(set(labels)) != len(labels):
            raise ValueError(f"eval.also names a set twice: {labels}")
        return self

    def eval_verify(self) -> VerifyConfig:
        """The verifiers that decide held-out metrics: `eval.verify` as given (each of its
        lists must hold one that checks a reference), else training's that do, with those
        of the asked format beside them (VerifyConfig.held_out)."""
        if self.eval.verify is not None:
            self.eval.verify.with_reference()  # raises when a list has none
            return self.eval.verify
        return self.verify.held_out()

    def curate_config(self, round_: int, model: str, restate: bool = False) -> CurateConfig:
        """Round `round_`'s curate step, sampling with `model` (its generated prompts with
        an environment; with `restate`, the rule without the format's verdict)."""
        sections = self.curate_sections()
        if self.environment is not None:
            dataset = round_dataset(self.prompts.dataset, round_)
            sections["prompts"] = self.prompts.model_copy(
                update={"dataset": dataset, "split": "train"}
            )
        if restate:
            formats = self.verify.in_role("asked_format")
            names = [n for n in self.verify.all_names() if n not in formats]
            sections["verify"] = self.verify.model_copy(update={"rule": " and ".join(names)})
        return CurateConfig(
            **self.runtime(),
            **sections,
            name=self.name,
            model=model,
            round=round_,
            gates=self.gates,
        )

    def train_config(self, round_: int, restate: bool = False) -> TrainConfig:
        """Round `round_`'s training step: its kept data (and earlier rounds') -> model r+1
        (with `restate`, answers outside the asked format restated in it)."""
        settings = {f: getattr(self.train, f) for f in TrainSettings.model_fields}
        return TrainConfig(
            name=self.name,
            base_model=self.base_model,
            round=round_,
            lake=self.lake,
            tracking=self.tracking,
            data=TrainDataConfig(
                round=round_,
                all_rounds=self.train.all_rounds,
                pipeline=self.name,
                restate_format=self.format.tag if restate and self.format else None,
            ),
            **settings,
        )

    def restates(self, compliance: float | None) -> bool:
        """Whether a round sampled by a model with this held-out format share (None:
        unmeasured) restates answers outside the format (`format.remedy`)."""
        if self.format is None or self.format.remedy != "restate":
            return False
        return compliance is None or compliance < self.format.min_compliance

    def eval_config(self, round_: int, model: str) -> EvalConfig:
        """Held-out evaluation of model `round_` (model 0 is the base model)."""
        held_out = self.eval
        overrides = {
            k: v
            for k, v in dict(
                temperature=held_out.temperature,
                top_p=held_out.top_p,
                max_tokens=held_out.max_tokens,
            ).items()
            if v is not None
        }
        return EvalConfig(
            **self.runtime()
            | {"sampling": self.sampling.model_copy(update={**overrides, "k": held_out.n})},
            name=self.name,
            model=model,
            round=round_,
            prompts=held_out.prompts,
            n=held_out.n,
            ks=held_out.ks,
            verify=self.eval_verify(),
        )

    def forgetting_eval_config(self, check: int, round_: int, model: str) -> EvalConfig:
        """Evaluation of model `round_` on forgetting check number `check` (eval.also)."""
        also = self.eval.also[check]
        main = self.eval_config(round_, model)
        return main.model_copy(
            update={
                "name": forgetting_name(self.name, also),
                "prompts": also.prompts(),
                "verify": also.verify or main.verify,
            }
        )
