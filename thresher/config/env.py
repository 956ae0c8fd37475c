"""The environment section: a bootstrap's training prompts generated fresh each round by a
procedural environment (reasoning-gym), each task at a difficulty level that follows the
model (the curriculum)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from thresher.config.base import _Strict


class EnvTaskConfig(_Strict):
    """One task: its levels, easiest first, each a reasoning-gym config, and where it starts."""

    levels: list[dict[str, Any]] = Field(
        min_length=1,
        description="the task's reasoning-gym config at each level, easiest first",
    )
    start: int = Field(0, ge=0, description="the level of round 0")

    @model_validator(mode="after")
    def _start_is_a_level(self) -> EnvTaskConfig:
        if self.start >= len(self.levels):
            raise ValueError(f"start {self.start} is past the last level ({len(self.levels) - 1})")
        return self


class CurriculumConfig(_Strict):
    """Move a task's level after each round by how often the student's own answers were
    right (the correctness verdicts: the asked format, hints and teachers left out)."""

    low: float = Field(0.2, ge=0, le=1, description="below this pass rate: one level easier")
    high: float = Field(0.7, ge=0, le=1, description="above this pass rate: one level harder")
    probe: int = Field(
        0,
        ge=0,
        description="prompts per task generated one level harder each round (trained on like "
        "the rest); in the band, the level rises when the student solves them at least "
        "`low` of the time",
    )

    @model_validator(mode="after")
    def _band(self) -> CurriculumConfig:
        if self.low >= self.high:
            raise ValueError(f"the band needs low < high, got {self.low} and {self.high}")
        return self


class EnvironmentConfig(_Strict):
    """Fresh training prompts each round: `per_round` entries per task, from round r's own
    seeds, never a question of an eval or test split; the round's prompts are the dataset
    `<prompts.dataset>-round-<r>`."""

    counted_at_default = frozenset({"env", "tasks", "per_round", "seed"})

    env: Literal["reasoning-gym"] = "reasoning-gym"
    tasks: dict[str, EnvTaskConfig] = Field(min_length=1)
    per_round: int = Field(100, ge=1, description="prompts generated per task and round")
    seed: int = Field(0, description="round r's entries come from seeds after seed + r * 100003")
    instruction: str | None = Field(
        None, description="appended to every question (default: ask for <answer> tags)"
    )
    curriculum: CurriculumConfig | None = Field(
        None, description="levels follow the model (unset: every task stays at `start`)"
    )


SEED_STRIDE = 100_003  # round r's seeds start at seed + r * SEED_STRIDE


def round_dataset(dataset: str, round_: int) -> str:
    """The dataset holding round `round_`'s generated prompts."""
    return f"{dataset}-round-{round_}"
