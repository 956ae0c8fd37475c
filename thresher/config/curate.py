"""The curate pipeline's config: its gates, difficulty, rationalization and sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from thresher.config.base import _Strict, never
from thresher.config.engine import EngineStage, PromptsConfig, ServerConfig, model_id
from thresher.config.select import SelectConfig
from thresher.config.verify import VerifyConfig


class GatesConfig(_Strict):
    """Checks that decide whether a pipeline may run, not what it makes: left out of the
    selection's and the run's identity, so changing them neither resamples nor reselects."""

    min_pairwise_accuracy: float = Field(
        0.85,
        ge=0,
        le=1,
        description="a pipeline using the `reward` verifier runs only when its reward model's "
        "latest `thresher rm-check` measured at least this pairwise accuracy on held-out "
        "preference pairs (a gate: it changes nothing selected)",
    )
    force_reward_model: bool = Field(
        False,
        description="run with the reward model even when it was never checked or its "
        "pairwise accuracy is below min_pairwise_accuracy (the run's summary records it)",
    )


class DifficultyConfig(_Strict):
    """Difficulty-aware sampling, from pass rates this pipeline measured in earlier rounds."""

    counted_at_default = frozenset({"skip_solved_above", "hard_below", "hard_k"})

    skip_solved_above: float | None = Field(
        None, ge=0, le=1, description="skip prompts last solved at this rate or more"
    )
    hard_below: float | None = Field(
        None, ge=0, le=1, description="prompts last solved at a lower rate than this ..."
    )
    hard_k: int | None = Field(None, ge=1, description="... get this many candidates")
    retire_after: int | None = Field(
        None,
        ge=1,
        description="stop sampling a prompt that had no passing candidate in this many "
        "curated rounds in a row (it carries no signal; view retired_prompts lists them)",
    )
    # the band only reports: it changes nothing sampled or selected
    min_pass_rate: float = never(
        default=0.0,
        ge=0,
        le=1,
        description="the band of pass rates that carries signal: a prompt solved more often "
        "than this ...",
    )
    max_pass_rate: float = never(
        default=1.0,
        ge=0,
        le=1,
        description="... and less often than this; reported as the share of prompts in the "
        "band (nothing is dropped for it)",
    )

    @model_validator(mode="after")
    def _hard_pair(self) -> DifficultyConfig:
        if (self.hard_below is None) != (self.hard_k is None):
            raise ValueError("hard_below and hard_k go together")
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError("min_pass_rate must be below max_pass_rate")
        return self

    def in_band(self, rate: float) -> bool:
        """Whether a prompt solved at `rate` carries signal (strictly inside the band)."""
        return self.min_pass_rate < rate < self.max_pass_rate


class RationalizeConfig(_Strict):
    """STaR rationalization: prompts with no passing candidate are sampled again with
    the reference answer as a hint; passing hinted candidates train without the hint."""

    counted_at_default = frozenset({"enabled", "k", "hint", "max_share"})

    enabled: bool = False
    k: int = Field(4, ge=1, description="hinted candidates per unsolved prompt")
    hint: str = Field(
        "{prompt} (Hint: the answer is {answer}.)",
        description="the hinted prompt; {prompt} and {answer} are filled in",
    )
    max_share: float | None = Field(
        0.5, gt=0, le=1, description="most hinted candidates among those kept (per batch)"
    )

    @model_validator(mode="after")
    def _hint_fields(self) -> RationalizeConfig:
        if "{answer}" not in self.hint or "{prompt}" not in self.hint:
            raise ValueError("hint must contain {prompt} and {answer}")
        return self


STUDENT_TEACHER = "student"  # a teacher's model: the round's own, sampled again


class TeacherConfig(_Strict):
    """A stronger source for the prompts the student cannot solve yet: a local model folder
    (vLLM) or a model behind an OpenAI-compatible server. Its candidates are verified like the
    student's, stored with their source (`teacher:<name>`) and train as text (any tokenizer
    or chat template)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the source's name")
    model: str = Field(
        description="a local model folder vLLM can load (or the server's name); `student`: the "
        "round's own model, sampled again (more samples where it is stuck)"
    )
    server: ServerConfig | None = Field(None, description="sample from this server instead")
    k: int = Field(4, ge=1, description="candidates per prompt it gets")
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="sampling settings that differ from the round's (temperature, max_tokens, "
        "chat, stop, ...)",
    )
    template: str = Field(
        "{prompt}",
        description="what the teacher is sent, {prompt} filled in (e.g. worked examples before "
        "it for a base model; with sampling: {chat: false}, a completion prompt)",
    )
    budget: int = Field(128, ge=1, description="most candidates it samples per round")
    aim: Literal["unsolved", "below"] = Field(
        "unsolved",
        description="which prompts it gets: those the student left unsolved this round, or "
        "those below `below` pass rate",
    )
    below: float = Field(0.25, gt=0, le=1, description="with aim: below, the pass rate")

    @model_validator(mode="after")
    def _template_and_budget(self) -> TeacherConfig:
        _fills(self.template, "prompt")
        if self.budget < self.k:
            raise ValueError(f"budget {self.budget} is below k {self.k}: it would sample nothing")
        return self


class HintsConfig(_Strict):
    """Prompts the student left unsolved, sampled again by the student with the first part of
    a verified solution (a teacher's this round, else the student's own from an earlier round)
    as a hint; passing hinted candidates train without the hint."""

    share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the share of a verified solution's words given as the hint (unset: off)",
    )
    k: int = Field(4, ge=1, description="hinted candidates per prompt")
    template: str = Field(
        "{prompt}\n\nA solution starts: {hint}",
        description="the hinted prompt; {prompt} and {hint} are filled in",
    )
    prompts: int = Field(64, ge=1, description="most prompts hinted per round")
    max_share: float | None = Field(
        0.5, gt=0, le=1, description="most hinted candidates among those kept (per batch)"
    )

    @property
    def enabled(self) -> bool:
        return self.share is not None

    @model_validator(mode="after")
    def _hint_fields(self) -> HintsConfig:
        _fills(self.template, "prompt", "hint")
        return self


def _fills(template: str, *fields: str) -> None:
    """Raise unless `template` names each field and str.format fills it with nothing else
    (a literal brace is written twice: {{ }})."""
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(f"template must contain {', '.join('{' + f + '}' for f in fields)}")
    try:
        template.format(**dict.fromkeys(fields, ""))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"template {template!r} names only {fields} (write a literal brace as {{{{ }}}}): {e!r}"
        ) from None


SEALED = (
    "the test split is sealed: curate, train, bootstrap and audits never read it; open it "
    "with a final evaluation (`thresher eval --split test --final`), which is recorded"
)


class GatedStage(EngineStage):
    """An engine stage with gates: checks that decide whether it may run at all."""

    gates: GatesConfig = never(default_factory=GatesConfig)


class CurateSections(_Strict):
    """What a curate round samples, verifies and selects (a bootstrap has them too)."""

    counted_at_default = frozenset({"prompts", "verify", "select", "difficulty", "rationalize"})

    prompts: PromptsConfig
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    difficulty: DifficultyConfig = Field(default_factory=DifficultyConfig)
    rationalize: RationalizeConfig = Field(default_factory=RationalizeConfig)
    teachers: list[TeacherConfig] = Field(
        default_factory=list, description="stronger sources for what the student cannot solve"
    )
    hints: HintsConfig = Field(default_factory=HintsConfig)

    @model_validator(mode="after")
    def _teacher_names(self) -> CurateSections:
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must differ: {names}")
        return self

    def curate_sections(self) -> dict[str, Any]:
        """These sections by name (to build a curate config from another that has them)."""
        return {f: getattr(self, f) for f in CurateSections.model_fields}


class CurateConfig(GatedStage, CurateSections):
    """A curate pipeline: sample, verify and select one round."""

    counted_at_default = frozenset({"model", "lora", "round", "server"})

    model: str = Field(description="a local model folder vLLM can load (or the server's name)")
    lora: str | None = Field(None, description="a LoRA adapter folder applied to `model`")
    round: int = Field(0, ge=0)
    server: ServerConfig | None = None

    @model_validator(mode="after")
    def _test_split_is_sealed(self, info: ValidationInfo) -> CurateConfig:
        if self.prompts.split == "test" and not (info.context or {}).get("open_test"):
            raise ValueError(SEALED)
        return self

    @model_validator(mode="after")
    def _lora_needs_local_engine(self) -> CurateConfig:
        if self.lora and self.server:
            raise ValueError("lora applies to the local engine; a server loads adapters itself")
        if self.server and self.executor != "local":
            raise ValueError("executor: ray runs its own engines; it does not apply to a server")
        self.verify.check_pipeline(self)
        return self

    def teacher_config(self, teacher: TeacherConfig) -> CurateConfig:
        """This run as `teacher` samples it: its model (or server) and sampling settings."""
        sampling = self.sampling.model_dump() | teacher.sampling | {"k": teacher.k}
        own = teacher.model == STUDENT_TEACHER
        return self.model_copy(
            update={
                "model": self.model if own else teacher.model,
                "lora": self.lora if own else None,
                "server": self.server if own else teacher.server,
                "sampling": type(self.sampling).model_validate(sampling),
                "teachers": [],
            }
        )

    @property
    def placement(self) -> Literal["local", "server", "ray"]:
        """Where sampling runs: a server when one is set, else the executor's engines."""
        return "server" if self.server else self.executor

    @property
    def model_id(self) -> str:
        """What the `model` column records: the model, plus the adapter when there is one."""
        return model_id(self.model, self.lora)
