"""Typed views of what the curate, train and eval flows return (their run summaries), for
the flows that compose them: a key read in another module is a field here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Summary(BaseModel):
    model_config = ConfigDict(extra="allow")


class CurateSummary(_Summary):
    """What a curate run did and kept."""

    run_id: str
    prompts: int | None = None
    candidates: int | None = None
    passed: int | None = None
    kept: int | None = None
    sampled_now: int | None = None
    skipped_solved: int | None = None
    retired: int | None = None
    band: Any = None
    monitors: dict[str, Any] | None = None
    tokens: int | None = None  # sampled for the selection's prompts
    tokens_per_kept: float | None = None
    sources: dict[str, dict[str, int]] | None = None  # source -> candidates, kept, tokens

    def line(self, round_: int) -> str:
        """e.g. 'round 0: 1000 prompts sampled (0 skipped as solved), 8000 candidates, ...'."""
        retired = f", {self.retired} retired" if self.retired else ""
        return (
            f"round {round_}: {self.prompts} prompts sampled ({self.skipped_solved} skipped "
            f"as solved{retired}), {self.candidates} candidates, {self.passed} passed, "
            f"kept {self.kept}"
            + (f" ({self.tokens_per_kept:g} tokens per kept)" if self.tokens_per_kept else "")
            + self.by_source()
        )

    def by_source(self) -> str:
        """e.g. '; kept by source: student 40, teacher:big 12' (nothing with one source)."""
        sources = self.sources or {}
        if len(sources) < 2:
            return ""
        return "; kept by source: " + ", ".join(f"{s} {c['kept']}" for s, c in sources.items())

    def brief(self) -> dict[str, Any]:
        """What a bootstrap records of the round's curation."""
        keys = ("run_id", "candidates", "passed", "kept", "sampled_now", "skipped_solved")
        keys += ("retired", "band", "tokens", "tokens_per_kept", "sources")
        return {k: getattr(self, k) for k in keys}


class TrainSummary(_Summary):
    """A training run: its model and how it went."""

    run_id: str
    model_dir: str | None = None
    rows: int | None = None
    steps: int | None = None
    final_loss: float | None = None
    mix: Any = None
    already_trained: bool = False

    def brief(self) -> dict[str, Any]:
        """What a bootstrap records of the round's training."""
        keys = ("run_id", "rows", "steps", "final_loss", "model_dir", "mix")
        return {k: getattr(self, k) for k in keys if k in self.model_fields_set}


class Metric(_Summary):
    task: str
    metric: str
    value: float | None


class EvalSummary(_Summary):
    """A held-out evaluation: pass@k per task and overall ('all')."""

    run_id: str
    metrics: list[Metric]

    def overall(self, metric: str = "pass@1") -> float:
        """An overall metric (ValueError when the evaluation did not measure it)."""
        for m in self.metrics:
            if m.task == "all" and m.metric == metric and m.value is not None:
                return m.value
        raise ValueError(f"the evaluation measured no overall {metric} (metrics: {self.metrics})")

    def line(self) -> str:
        """e.g. 'pass@1 0.160, pass@8 0.515'."""
        return ", ".join(f"{m.metric} {m.value:.3f}" for m in self.metrics if m.task == "all")

    def metric_rows(self) -> list[dict[str, Any]]:
        """The metrics as the run summary stores them."""
        return [m.model_dump() for m in self.metrics]


class BootstrapSummary(_Summary):
    """Self-bootstrap rounds: what each round did, every model's evaluation, the best."""

    run_id: str | None = None
    best_model: str | None = None
    best_round: int | None = None
    stopped: str | None = None
    rounds: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
