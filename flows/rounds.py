"""A bootstrap's state across rounds and its transitions, apart from any I/O: which model
samples the next round, the best model so far, the stop rule and the record of each round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thresher.flows.summaries import CurateSummary, EvalSummary, TrainSummary


def sampling_model_round(pass1: list[float], best_round: int, tolerance: float | None) -> int:
    """Which model samples the next round: the newest (the last of `pass1`, held-out
    pass@1 of models 0..r), or the best so far when the newest fell below it by more than
    `tolerance` (None: never roll back)."""
    newest = len(pass1) - 1
    if tolerance is not None and pass1[newest] < pass1[best_round] - tolerance:
        return best_round
    return newest


@dataclass
class Rounds:
    """Held-out pass@1 of models 0..r, the best of them, rounds in a row that gained less
    than `min_gain`, why the run stopped (None: it goes on) and what each round did."""

    max_rounds: int
    min_gain: float
    patience: int
    tolerance: float | None  # rollback: None never samples with an earlier model
    pass1: list[float] = field(default_factory=list)
    best_round: int = 0
    stale: int = 0
    stopped: str | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    def start(self, base: EvalSummary, also: list[dict] | None = None) -> None:
        """Model 0 (the base model) was evaluated."""
        self.pass1 = [base.overall()]
        self.evals = [
            {"round": 0, "metrics": base.metric_rows(), **({"also": also} if also else {})}
        ]

    @property
    def best(self) -> float:
        """The best held-out pass@1 so far."""
        return self.pass1[self.best_round]

    def next_round(self) -> int | None:
        """The round to run next, or None when the run has stopped (max_rounds reached)."""
        if self.stopped is None and len(self.rounds) >= self.max_rounds:
            self.stopped = f"max_rounds ({self.max_rounds}) reached"
        return None if self.stopped else len(self.rounds)

    def sampling_model(self) -> int:
        """The model that samples the next round (the newest, or the best after a regression)."""
        return sampling_model_round(self.pass1, self.best_round, self.tolerance)

    def record(
        self,
        source: int,
        curated: CurateSummary,
        trained: TrainSummary,
        evaluated: EvalSummary,
        also: list[dict] | None = None,
        notes: dict[str, Any] | None = None,
    ) -> float:
        """Round r (sampled with model `source`) curated, trained model r+1 and evaluated
        it; returns its gain over the best earlier model."""
        r = len(self.rounds)
        pass1 = evaluated.overall()
        gain = pass1 - self.best
        self.rounds.append(
            {
                "round": r,
                "sampled_with": source,
                "curate": curated.brief(),
                "train": trained.brief(),
                "monitors": curated.monitors,
                **(notes or {}),
            }
        )
        entry = {"round": r + 1, "metrics": evaluated.metric_rows()}
        self.evals.append(entry | ({"also": also} if also else {}))
        self.pass1.append(pass1)
        if pass1 > self.best:
            self.best_round = r + 1
        self.stale = self.stale + 1 if gain < self.min_gain else 0
        if self.stale >= self.patience:
            self.stopped = f"pass@1 gained less than {self.min_gain} for {self.stale} round(s)"
        return gain

    def overall(self, model: int, metric: str) -> float | None:
        """Model `model`'s overall held-out `metric` (None: not measured)."""
        for m in self.evals[model]["metrics"] if model < len(self.evals) else []:
            if m["task"] == "all" and m["metric"] == metric:
                return m["value"]
        return None

    def summary(self) -> dict[str, Any]:
        """The run summary's record of the rounds."""
        out: dict[str, Any] = {"rounds": self.rounds, "evals": self.evals}
        if self.stopped:
            out |= {"stopped": self.stopped, "best_round": self.best_round}
        return out
