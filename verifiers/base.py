"""The verifier interface: a batch of candidates in, one verdict row per candidate out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from thresher.config import EngineStage, GatesConfig
    from thresher.stores.lake import Lake

# how a verifier takes part in held-out evaluation (Verifier.held_out_role)
HeldOutRole = Literal["reference", "asked_format"]

# name -> class: every subclass of Verifier that sets `name` adds itself on import
_REGISTERED: dict[str, type[Verifier]] = {}


class Verifier:
    """A verifier: scores a batch of candidates, one verdict row per candidate.

    A subclass sets `name` (how configs, rules and verdict rows call it), declares its
    options as the pydantic model `Options`, and implements `run`; defining it registers
    it under its name. The other class attributes are its traits; the class methods are
    hooks through which it takes part in a pipeline beyond scoring (each does nothing
    unless overridden), so no other module needs to know a verifier by its name.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1  # raised when its verdicts change for the same candidate
    uses_device: ClassVar[bool] = False  # runs a model on the accelerator: takes the slot
    ranks: ClassVar[bool] = False  # its score ranks candidates (`top_score` selection)
    groups: ClassVar[bool] = False  # scores a prompt's candidates together: gets all of them
    # judges against the prompt's own reference (answer or tests): a truth the loop being
    # trained cannot move, so it may decide held-out metrics
    uses_reference: ClassVar[bool] = False
    # reads what a code tool printed (a candidate's tool outputs); otherwise it reads the
    # candidate without them, so an answer counts only where the model itself states it
    reads_tool_output: ClassVar[bool] = False
    # options of how it runs, not what it finds: left out of its verdicts' digest
    operational: ClassVar[frozenset[str]] = frozenset()

    class Options(BaseModel):
        """The verifier's options (none): a subclass declares its own, typed."""

        model_config = ConfigDict(extra="forbid")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _register(cls)

    def __init__(self, **options: Any) -> None:
        self.options = self.Options.model_validate(options)

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict row per row of `batch` (the columns of `verdict_frame`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define run(batch)")

    @classmethod
    def held_out_role(cls) -> HeldOutRole | None:
        """Its part in held-out evaluation: "reference" (uses_reference), "asked_format" or None."""
        return "reference" if cls.uses_reference else None

    @classmethod
    def check_config(cls, options: Any, config: EngineStage) -> None:
        """Refuse (ValueError) a pipeline config it cannot run in with these options."""

    @classmethod
    def gate(cls, lake: Lake, options: Any, gates: GatesConfig) -> dict[str, Any] | None:
        """A check before anything is sampled: the figure to record (or None); GateRefused."""
        return None

    @classmethod
    def tests_suite(cls, options: Any) -> str | None:
        """The tests it judges code by, "original" or "strengthened" (None: it runs none)."""
        return None

    @classmethod
    def prepare_rows(cls, lake: Lake, rows: pl.DataFrame, options: Any) -> pl.DataFrame:
        """The rows the verifying stage hands to `run`, from those it found unscored."""
        return rows


class GateRefused(ValueError):
    """A verifier's gate stopped a pipeline before it sampled anything."""


def class_path(cls: type) -> str:
    """`module:QualifiedName`, how a config names a class it imports."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _register(cls: type[Verifier]) -> None:
    """Add a verifier class under its name; TypeError for a class that cannot be one."""
    name = cls.__dict__["name"]
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise TypeError(
            f"verifier {class_path(cls)}: name must be a non-empty string without ':' "
            f"or surrounding spaces, not {name!r}"
        )
    if cls.run is Verifier.run:
        raise TypeError(f"verifier {class_path(cls)} does not define run(batch)")
    if not (isinstance(cls.Options, type) and issubclass(cls.Options, BaseModel)):
        raise TypeError(f"verifier {class_path(cls)}: Options must be a pydantic model")
    stray = sorted(set(cls.operational) - set(cls.Options.model_fields))
    if stray:
        raise TypeError(f"verifier {class_path(cls)}: operational names no option: {stray}")
    taken = _REGISTERED.get(name)
    # the same class defined again (its module reloaded) replaces itself
    if taken is not None and class_path(taken) != class_path(cls):
        raise TypeError(
            f"verifier name {name!r} is taken: {class_path(taken)} and {class_path(cls)} "
            "both claim it"
        )
    _REGISTERED[name] = cls


def registered() -> dict[str, type[Verifier]]:
    """The verifier classes defined so far, by name."""
    return dict(_REGISTERED)


@dataclass(frozen=True)
class Verdict:
    """One verifier's judgement of one candidate."""

    score: float
    passed: bool
    reason: str
    answer: str | None = None  # the final answer it read (stripped), for answer monitors


def quote(text: object, limit: int = 160) -> str:
    """repr() of `text`, cut to `limit` characters: a reason quotes, it does not copy."""
    s = str(text)
    return repr(s if len(s) <= limit else s[:limit] + "...")


def verdict_frame(
    name: str,
    candidate_ids: list[str],
    verdicts: list[Verdict],
    elapsed_ms: list[float],
    answers: list[str | None] | None = None,
) -> pl.DataFrame:
    """Assemble verdicts into the `verdicts` columns (`answers`, when given, replace the
    verdicts' own)."""
    if answers is None:
        answers = [v.answer for v in verdicts]
    return pl.DataFrame(
        {
            "candidate_id": candidate_ids,
            "verifier": [name] * len(verdicts),
            "score": [float(v.score) for v in verdicts],
            "passed": [bool(v.passed) for v in verdicts],
            "reason": [v.reason for v in verdicts],
            "elapsed_ms": elapsed_ms,
            "answer": [None if a is None else str(a).strip()[:200] for a in answers],
        },
        schema={
            "candidate_id": pl.String,
            "verifier": pl.String,
            "score": pl.Float64,
            "passed": pl.Boolean,
            "reason": pl.String,
            "elapsed_ms": pl.Float64,
            "answer": pl.String,
        },
    )


def map_rows(name: str, batch: pl.DataFrame, check: Callable[[dict], Verdict]) -> pl.DataFrame:
    """Run a per-row check over a batch, timing each row."""
    verdicts, elapsed = [], []
    for row in batch.iter_rows(named=True):
        start = time.perf_counter()
        verdicts.append(check(row))
        elapsed.append((time.perf_counter() - start) * 1000)
    return verdict_frame(name, batch["candidate_id"].to_list(), verdicts, elapsed)
