"""The bootstrap's state across rounds: pure transitions, no engine, no lake."""

from __future__ import annotations

import pytest

from thresher.flows.rounds import Rounds
from thresher.flows.summaries import CurateSummary, EvalSummary, TrainSummary


def _eval(pass1: float) -> EvalSummary:
    return EvalSummary(
        run_id="e",
        metrics=[
            {"task": "all", "metric": "pass@1", "value": pass1},
            {"task": "add", "metric": "pass@1", "value": 0.0},
        ],
    )


def _round(state: Rounds, pass1: float, also=None) -> float:
    curated = CurateSummary(run_id="c", prompts=3, candidates=9, passed=4, kept=2, monitors={})
    trained = TrainSummary(run_id="t", model_dir="m", rows=2, steps=1)
    return state.record(state.sampling_model(), curated, trained, _eval(pass1), also)


def test_rounds_run_to_max_rounds_and_keep_the_best():
    state = Rounds(max_rounds=3, min_gain=0.01, patience=5, tolerance=None)
    state.start(_eval(0.2))
    seen = []
    while (r := state.next_round()) is not None:
        seen.append(r)
        _round(state, [0.3, 0.25, 0.4][r])
    assert seen == [0, 1, 2]
    assert state.stopped == "max_rounds (3) reached"
    assert state.best_round == 3 and state.best == 0.4
    assert state.pass1 == [0.2, 0.3, 0.25, 0.4]
    summary = state.summary()
    assert [e["round"] for e in summary["evals"]] == [0, 1, 2, 3]
    assert summary["rounds"][1]["train"] == {"run_id": "t", "rows": 2, "steps": 1, "model_dir": "m"}
    assert summary["best_round"] == 3


def test_patience_stops_after_rounds_without_gain():
    state = Rounds(max_rounds=9, min_gain=0.05, patience=2, tolerance=None)
    state.start(_eval(0.5))
    assert _round(state, 0.52) == pytest.approx(0.02)  # under min_gain: stale 1
    assert state.next_round() == 1
    _round(state, 0.6)  # a gain resets the count
    assert state.stale == 0 and state.best_round == 2
    _round(state, 0.6)
    assert state.next_round() == 3
    _round(state, 0.59)
    assert state.next_round() is None
    assert state.stopped == "pass@1 gained less than 0.05 for 2 round(s)"


def test_a_regression_beyond_tolerance_samples_with_the_best_model():
    state = Rounds(max_rounds=5, min_gain=0.0, patience=9, tolerance=0.02)
    state.start(_eval(0.4))
    _round(state, 0.5)
    _round(state, 0.45)  # 0.05 under the best: the next round samples with model 1
    assert state.sampling_model() == 1
    _round(state, 0.49)  # within tolerance of the best: the newest samples
    assert state.sampling_model() == 3
    assert [r["sampled_with"] for r in state.rounds] == [0, 1, 1]
    never = Rounds(max_rounds=5, min_gain=0.0, patience=9, tolerance=None)
    never.start(_eval(0.4))
    _round(never, 0.1)
    assert never.sampling_model() == 1


def test_forgetting_results_are_kept_with_their_round():
    state = Rounds(max_rounds=2, min_gain=0.0, patience=9, tolerance=None)
    state.start(_eval(0.4), [{"check": "g/eval", "pass@1": 0.3}])
    _round(state, 0.5, [{"check": "g/eval", "pass@1": 0.2}])
    assert state.evals[0]["also"][0]["pass@1"] == 0.3
    assert state.evals[1]["also"][0]["pass@1"] == 0.2


def test_an_evaluation_without_overall_pass1_is_an_error():
    with pytest.raises(ValueError, match="no overall pass@1"):
        EvalSummary(run_id="e", metrics=[{"task": "add", "metric": "pass@1", "value": 1}]).overall()
