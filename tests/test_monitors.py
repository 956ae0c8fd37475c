"""Round monitors over a lake filled by hand: each monitor against a hand count, the
`monitors` table and `round_monitors` view, the gate's lines and the report's section."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import combinations

import numpy as np
import pytest

from thresher.config import BootstrapConfig, MonitorsGateConfig
from thresher.evaluators.monitors import (
    check_monitors,
    pairwise_similarity,
    record_monitors,
    round_monitors,
    sentences,
)
from thresher.stores.lake import PROMPT_DIFFICULTY_SQL, ROUND_MONITOR_COLUMNS
from thresher.stores.runs import record_run
from thresher.stores.tables import write_candidates, write_evals, write_selections

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FAIL, DUP = "failed", "duplicate_of:a0"
# prompt -> (candidate id, text, n_tokens, drop reason (None: kept), hinted)
ROUND_0 = {
    "pA": [
        ("a0", "Let me think.\nThe answer is 4.", 10, None, False),  # 4
        ("a1", "Let me  think. The answer is 4.", 20, DUP, False),  # 4, a0's words
        ("a2", "I guess 5", 30, FAIL, False),  # 5 (last number)
    ],
    "pB": [
        ("b0", "Let me think. No idea.", 40, FAIL, False),  # no answer
        ("b1", "Hmm. Maybe 8.", 50, FAIL, False),  # 8
        ("b2", "So. The answer is 4.", 60, None, False),  # 4
    ],
    "pC": [
        ("c0", "Well, no.", 70, FAIL, False),  # no answer
        ("c1", "Nope.", 80, FAIL, False),  # no answer
        ("c2", "Well, no.", 90, FAIL, False),  # no answer, c0's text
        ("c3", "Hint says 9. The answer is 9.", 100, None, True),  # hinted: lengths only
    ],
}
# By hand: distinct answers {4, 5}, {none, 8, 4}, {none}; similarity per prompt: one
# identical pair of three (pA, pC), none (pB); "let me think." opens pA and pB, "the answer
# is 4." closes them; tokens 10..100, kept 10, 60, 100; pA and pB mixed, pC all fail.
EXPECTED = {
    "prompts": 3,
    "candidates": 10,
    "distinct_answers": 2.0,
    "similarity": round((1 / 3 + 0 + 1 / 3) / 3, 4),
    "top_opening": "let me think.",
    "top_opening_share": round(2 / 3, 4),
    "top_closing": "the answer is 4.",
    "top_closing_share": round(2 / 3, 4),
    "all_p50": 55.0,
    "all_p90": 91.0,
    "kept_p50": 60.0,
    "kept_p90": 92.0,
    "kept_length_ratio": round(60 / 55, 4),
    "hinted_share": round(1 / 3, 4),
    "headroom": 0.5,
    "headroom_metric": "pass@4",
    "mixed_share": round(2 / 3, 4),
    # no prompt rows and no verdicts with answers here: tests/test_answer_prior.py counts these
    "answer_excess": None,
    "answer_excess_at": None,
}


def _curate_run(lake, name: str, round_: int, selection_id: str) -> None:
    record_run(lake, f"curate-{selection_id}", flow="curate", round_=round_, model="m",
               config={"name": name}, status="completed", started_at=T0, finished=True,
               selection_id=selection_id)  # fmt: skip


def _eval(lake, name: str, run_id: str, round_: int, values: dict[str, float], at) -> None:
    record_run(lake, run_id, flow="evaluate", round_=round_, model="m", config={"name": name},
               status="completed", started_at=at, finished=True)  # fmt: skip
    metrics = [{"task": "all", "metric": m, "value": v, "prompts": 4} for m, v in values.items()]
    metrics.append({"task": "arithmetic", "metric": "pass@1", "value": 0.0, "prompts": 4})
    # created_at is the time of writing: the latest evaluation is the last one written
    write_evals(lake, metrics, run_id, round=round_, model="m", split="eval", samples=4)


@pytest.fixture
def curated(lake):
    """Pipeline x's round 0 (ROUND_0), evaluated twice (pass@1 .1, pass@8 .9, then pass@1
    .25, pass@4 .75), and pipeline y's round 0 (another selection, evaluated later)."""
    cands, decisions = [], []
    for prompt_id, rows in ROUND_0.items():
        for i, (cid, text, tokens, reason, hinted) in enumerate(rows):
            cands.append({"candidate_id": cid, "prompt_id": prompt_id, "round": 0,
                          "sample_idx": i, "text": text, "n_tokens": tokens,
                          "hinted": hinted, "created_at": T0})  # fmt: skip
            decisions.append({"candidate_id": cid, "prompt_id": prompt_id, "reason": reason})
    write_candidates(lake, cands)
    write_selections(lake, "s-x0", 0, decisions, "curate-s-x0")
    _curate_run(lake, "x", 0, "s-x0")
    write_candidates(lake, [{"candidate_id": "y0", "prompt_id": "pA", "round": 0,
                             "text": "Other. 1", "n_tokens": 5, "hinted": False}])  # fmt: skip
    write_selections(lake, "s-y0", 0, [{"candidate_id": "y0", "prompt_id": "pA",
                                        "reason": None}], "curate-s-y0")  # fmt: skip
    _curate_run(lake, "y", 0, "s-y0")
    _eval(lake, "x", "ev-old", 0, {"pass@1": 0.1, "pass@8": 0.9}, T0)
    _eval(lake, "x", "ev-new", 0, {"pass@1": 0.25, "pass@4": 0.75}, T0 + timedelta(hours=1))
    _eval(lake, "y", "ev-y", 0, {"pass@1": 0.0, "pass@2": 1.0}, T0 + timedelta(hours=2))
    return lake


def test_each_monitor_matches_a_hand_count(curated):
    got = round_monitors(curated, "x", 0)
    assert got == {"selection_id": "s-x0", **EXPECTED}
    other = round_monitors(curated, "y", 0)
    assert other["prompts"] == 1 and other["similarity"] is None  # one candidate: no pairs
    assert other["headroom"] == 1.0 and other["headroom_metric"] == "pass@2"
    assert round_monitors(curated, "x", 1) == {}  # not curated


def test_texts_read_a_few_rows_at_a_time_give_the_same_monitors(curated, monkeypatch):
    import thresher.evaluators.monitors as monitors

    monkeypatch.setattr(monitors, "TEXT_BATCH_ROWS", 2)  # prompts span frames
    assert round_monitors(curated, "x", 0) == {"selection_id": "s-x0", **EXPECTED}


def test_mixed_share_is_the_prompt_difficulty_views(curated):
    # the view counts every pipeline's prompts together: its query over x's selections
    x = "(SELECT * FROM current_selections WHERE pipeline = 'x')"
    share = curated.query(
        f"""SELECT avg((kind = 'mixed')::INT) AS share
            FROM ({PROMPT_DIFFICULTY_SQL.format(selections=x)}) WHERE round = 0"""
    )["share"][0]
    assert round(share, 4) == round_monitors(curated, "x", 0)["mixed_share"]


def test_similarity_is_the_mean_of_pairwise_jaccard_estimates():
    from thresher.selection.minhash import jaccard, signatures

    texts = ["a b c d e f g", "a b c d e f h", "x y z", "a b c d e f g", "q", "r s"]
    group = np.array([0, 0, 1, 0, 2, 2])
    sigs = signatures(texts, 64, 3)
    got = pairwise_similarity(sigs, group)
    for g in (0, 2):
        rows = np.flatnonzero(group == g)
        by_pairs = np.mean([jaccard(sigs[a], sigs[b]) for a, b in combinations(rows, 2)])
        assert got[g] == pytest.approx(by_pairs)
    assert np.isnan(got[1])  # one text: no pair


def test_sentences_are_split_and_normalised_lightly():
    assert sentences("  Let me   THINK.\n\nSo 2+2=4!  Done? yes") == [
        "let me think.",
        "so 2+2=4!",
        "done?",
        "yes",
    ]
    assert sentences("   ") == []


def test_recorded_once_and_the_view_has_a_column_per_monitor(curated):
    recorded = record_monitors(curated, "x", 0, "curate-s-x0")
    assert recorded == {"selection_id": "s-x0", **EXPECTED}
    rows = curated.count("monitors")
    # the sentences and headroom's pass@k are details; the answer excess is unmeasured
    assert rows == len(EXPECTED) - 5
    assert record_monitors(curated, "x", 0, "curate-s-x0") == recorded
    assert curated.count("monitors") == rows  # a re-run adds nothing
    view = curated.query("SELECT * FROM round_monitors")
    assert view.columns == ["pipeline", "round", "selection_id"] + [
        c for c, _, _ in ROUND_MONITOR_COLUMNS
    ]
    assert view.height == 1  # y's monitors were not recorded
    row = view.row(0, named=True)
    assert row == {"pipeline": "x", "round": 0, **recorded}
    where = "WHERE metric = 'headroom'"
    assert curated.query(f"SELECT eval_run_id FROM monitors {where}")["eval_run_id"][0] == "ev-new"

    # a newer evaluation of model 0: recording again adds its headroom, and the view shows it
    _eval(curated, "x", "ev-newer", 0, {"pass@1": 0.5, "pass@2": 0.6}, T0 + timedelta(hours=3))
    again = record_monitors(curated, "x", 0, "curate-s-x0")
    assert again["headroom"] == 0.1 and again["headroom_metric"] == "pass@2"
    assert curated.count("monitors") == rows + 1
    row = curated.query("SELECT * FROM round_monitors").row(0, named=True)
    assert (row["headroom"], row["headroom_metric"]) == (0.1, "pass@2")


def test_the_gate_names_each_broken_threshold(curated):
    monitors = round_monitors(curated, "x", 0)
    assert check_monitors(monitors, MonitorsGateConfig()) == []
    holds = MonitorsGateConfig(
        min_distinct_answers=2,
        max_similarity=0.5,
        max_repeated_opening_share=0.7,
        max_repeated_closing_share=0.7,
        max_length_drift=0.1,
        max_hinted_share=0.5,
        min_headroom=0.5,
        min_mixed_share=0.5,
    )
    assert check_monitors(monitors, holds) == []
    broken = MonitorsGateConfig(
        min_distinct_answers=2.5, max_repeated_opening_share=0.5, max_length_drift=0.05
    )
    assert check_monitors(monitors, broken) == [
        "distinct_answers 2 is below min_distinct_answers 2.5",
        "top_opening_share 0.6667 is above max_repeated_opening_share 0.5",
        "kept_length_ratio 1.091 is 0.0909 from 1, over max_length_drift 0.05",
    ]
    unmeasured = {**monitors, "headroom": None, "hinted_share": None}
    gate = MonitorsGateConfig(min_headroom=0.1, max_hinted_share=0.1)
    assert check_monitors(unmeasured, gate) == [
        "headroom unmeasured in this round, min_headroom 0.1 needs it"
    ]


def test_a_headroom_gate_needs_a_k_above_one():
    config = {
        "name": "b",
        "base_model": "m",
        "prompts": {"dataset": "d", "split": "train"},
        "eval": {"prompts": {"dataset": "d", "split": "eval"}, "n": 4, "ks": [1]},
        "monitors": {"min_headroom": 0.1},
    }
    with pytest.raises(ValueError, match="min_headroom needs a pass@k with k > 1"):
        BootstrapConfig(**config)
    config["eval"]["ks"] = [1, 4]
    assert BootstrapConfig(**config).monitors.min_headroom == 0.1


def test_the_gate_thresholds_leave_the_bootstrap_run_id_alone():
    from thresher.identities import bootstrap_run_id

    config = {
        "name": "b",
        "base_model": "m",
        "prompts": {"dataset": "d", "split": "train"},
        "eval": {"prompts": {"dataset": "d", "split": "eval"}, "n": 4, "ks": [1, 4]},
    }
    ids = {
        bootstrap_run_id(BootstrapConfig(**config, monitors=monitors))
        for monitors in (None, {"min_distinct_answers": 9}, {"max_similarity": 0.1})
    }
    assert len(ids) == 1  # a run stopped at the gate resumes once a threshold is relaxed


def test_the_report_has_a_monitors_section(curated, tmp_path):
    from thresher.evaluators.page import write_report
    from thresher.evaluators.report import monitors_by_round

    record_monitors(curated, "x", 0, "curate-s-x0")
    frame = monitors_by_round(curated, "x")
    assert frame["round"].to_list() == [0] and frame["distinct_answers"][0] == 2.0
    page = write_report(curated, tmp_path / "report", name="x").read_text()
    assert "<h2>Monitors</h2>" in page
    assert "let me think." in page and "the answer is 4." in page
    assert (tmp_path / "report" / "monitors.png").exists()


def test_headroom_is_of_the_model_that_sampled_a_rolled_back_round(lake):
    # round 1 of z sampled with model 0 (a rollback): its headroom is model 0's, not model 1's
    write_candidates(lake, [{"candidate_id": f"z{i}", "prompt_id": "pA", "round": 1,
                             "model": "m0", "text": f"The answer is {i}.", "n_tokens": 5,
                             "hinted": False} for i in range(2)])  # fmt: skip
    picks = [{"candidate_id": f"z{i}", "prompt_id": "pA", "reason": None} for i in range(2)]
    write_selections(lake, "s-z1", 1, picks, "curate-s-z1")
    _curate_run(lake, "z", 1, "s-z1")
    for round_, model, values in ((0, "m0", (0.2, 0.6)), (1, "m1", (0.1, 0.2))):
        run_id = f"ev-z{round_}"
        record_run(lake, run_id, flow="evaluate", round_=round_, model=model, config={"name": "z"},
                   status="completed", started_at=T0, finished=True)  # fmt: skip
        metrics = [{"task": "all", "metric": m, "value": v, "prompts": 4}
                   for m, v in zip(("pass@1", "pass@4"), values, strict=True)]  # fmt: skip
        write_evals(lake, metrics, run_id, round=round_, model=model, split="eval", samples=4)
    got = round_monitors(lake, "z", 1)
    assert (got["headroom"], got["headroom_metric"]) == (0.4, "pass@4")
