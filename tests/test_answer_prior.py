"""Gains above the answer prior and the asked format, against hand counts: answer balance in
selection, the constant-answer baseline and non-modal pass@1, the `answer_format` verdict,
per-task answer monitors, restating an answer in the format, and the curriculum's levels."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest
import yaml
from helpers import ARITHMETIC_LEVELS, ROOT

from thresher.answers import answer_key
from thresher.config import BootstrapConfig, EnvironmentConfig, MonitorsGateConfig, SelectConfig
from thresher.evaluators.monitors import check_monitors, task_answer_monitors
from thresher.evaluators.passk import prior_metrics
from thresher.selection.select import decide, reference_shares
from thresher.stores.export import restate
from thresher.verifiers import get_verifier

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _rows(answers: list[str], task: str = "mc") -> list[dict]:
    """One passing candidate per prompt, its final answer as given."""
    return [
        {
            "candidate_id": f"c{i}",
            "prompt_id": f"p{i}",
            "sample_idx": 0,
            "text": f"I choose {a}. {i}",
            "n_tokens": 5,
            "finish_reason": "stop",
            "hinted": False,
            "passed": True,
            "prompt": f"question {i}",
            "messages": None,
            "has_tests": False,
            "task": task,
            "reference": a,
            "answer": a,
            "score": 1.0,
        }
        for i, a in enumerate(answers)
    ]


def test_answer_balance_keeps_a_skewed_answer_to_its_reference_share_plus_the_margin():
    # references: 60 % "A" over the round; the model solved the A prompts far more often
    refs = [("mc", "A")] * 60 + [("mc", x) for x in "BCD" * 13] + [("mc", "B")]
    shares = reference_shares(refs)
    assert shares["mc"]["a"] == 0.6
    kept_answers = ["A"] * 40 + ["B"] * 4 + ["C"] * 3 + ["D"] * 3  # A: 80 % of 50
    spec = SelectConfig(near_dup=False, cap=4, answer_balance=0.05)
    on = _rows(kept_answers)
    decide(on, spec, reference_shares=shares)
    kept = [r for r in on if r["reason"] is None]
    a = sum(r["answer"] == "A" for r in kept)
    # by hand: A <= 0.65 * (10 + A')  ->  A' <= 0.65 * 10 / 0.35 = 18.57 -> 18 of 28 kept
    assert (a, len(kept)) == (18, 28)
    assert a / len(kept) <= 0.6 + 0.05
    dropped = [r["reason"] for r in on if r["reason"] is not None]
    assert dropped == ["answer_share:a"] * 22
    off = _rows(kept_answers)
    decide(off, SelectConfig(near_dup=False, cap=4), reference_shares=shares)
    assert sum(r["reason"] is None and r["answer"] == "A" for r in off) == 40  # 80 %


def test_answer_balance_is_per_task_and_leaves_unread_answers_alone():
    rows = _rows(["1"] * 9 + ["2"], task="t1") + _rows(["7"] * 5, task="t2")
    for i, r in enumerate(rows):  # distinct prompts across both tasks
        r["prompt_id"], r["candidate_id"] = f"p{i}", f"c{i}"
    rows.append({**rows[0], "candidate_id": "nx", "prompt_id": "px", "answer": None})
    shares = {"t1": {"1": 0.5, "2": 0.5}, "t2": {"7": 1.0}}
    decide(rows, SelectConfig(near_dup=False, answer_balance=0.0), reference_shares=shares)
    t1 = [r for r in rows if r["task"] == "t1" and r["reason"] is None and r["answer"]]
    # t1 by hand: K = 11 (9 ones, 1 two, 1 unread); ones <= 0.5 * (11 - 9) / 0.5 = 2
    assert sum(r["answer"] == "1" for r in t1) == 2
    assert all(r["reason"] is None for r in rows if r["task"] == "t2")  # 7 is all of t2
    assert next(r for r in rows if r["candidate_id"] == "nx")["reason"] is None


def test_answer_keys_fold_spelling_not_value():
    assert answer_key(" 1.0 ") == answer_key("+1") == answer_key("1") == "1"
    assert answer_key("2,744") == "2744" and answer_key("A.") == "a"
    assert answer_key("-1") != answer_key("1") and answer_key(None) is None


def test_the_constant_answer_baseline_and_non_modal_pass_at_1_match_a_hand_count():
    counts = pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(7)],
            "task": ["lc"] * 5 + ["gcd"] * 2,
            "reference": ["1", "1", "1.0", "2", "3", "5", "6"],
            "n": [2] * 7,
            "c": [2, 2, 1, 0, 1, 1, 0],
        }
    )
    got = {
        (m["task"], m["metric"]): (round(m["value"], 6), m["prompts"])
        for m in prior_metrics(counts)
    }
    # lc: "1" is 3 of 5 references; non-modal prompts p3, p4: pass@1 (0 + 0.5) / 2
    assert got[("lc", "constant-answer")] == (0.6, 5)
    assert got[("lc", "pass@1 non-modal")] == (0.25, 2)
    # gcd: a tie between 5 and 6 goes to the first in order ("5"): p6 is non-modal
    assert got[("gcd", "constant-answer")] == (0.5, 2)
    assert got[("gcd", "pass@1 non-modal")] == (0.0, 1)
    # all: 4 of 7 prompts hold their task's modal answer; the 3 others average 0.5 / 3
    assert got[("all", "constant-answer")] == (round(4 / 7, 6), 7)
    assert got[("all", "pass@1 non-modal")] == (round(0.5 / 3, 6), 3)


ASKS = "What is 2 + 3? Give only the final answer between <answer> and </answer> tags."


@pytest.mark.parametrize(
    ("text", "passed", "answer"),
    [
        ("2 + 3 = 5. <answer>5</answer>", True, "5"),
        ("<answer>4</answer> no, <answer> 5 </answer>", True, "5"),  # the last pair
        ("<answer> = -70", False, None),  # unclosed: not an answer in the format
        ("<answer> is 3", False, None),
        ("<answer> is not a valid output in Python 3.", False, None),
        ("The answer is 5.", False, None),
        ("<answer>  </answer>", False, None),
    ],
)
def test_answer_format_reads_the_tags_as_the_environment_does(text, passed, answer):
    v = get_verifier("answer_format").check(text, ASKS)
    assert (v.passed, v.answer) == (passed, answer)


def test_answer_format_passes_prompts_that_ask_no_format_unless_always():
    assert get_verifier("answer_format").check("The answer is 5.", "What is 2 + 3?").passed
    strict = get_verifier("answer_format", {"when": "always"})
    assert not strict.check("The answer is 5.", "What is 2 + 3?").passed


def test_a_right_answer_outside_the_asked_format_fails_the_protocol_rule():
    from thresher.rules import rule_sql  # noqa: F401  (the rule is SQL over both verdicts)

    batch = pl.DataFrame(
        {
            "candidate_id": ["in", "out"],
            "text": ["2 + 3 = 5. <answer>5</answer>", "2 + 3 = 5. The answer is 5."],
            "answer": ["5", "5"],
            "prompt": [ASKS, ASKS],
            "messages": [None, None],
        }
    )
    math = get_verifier("math").run(batch)
    fmt = get_verifier("answer_format").run(batch)
    assert math["passed"].to_list() == [True, True]  # the lenient reading passes both
    assert fmt["passed"].to_list() == [True, False]
    assert math["answer"].to_list() == ["5", "5"] and fmt["answer"].to_list() == ["5", None]


def test_restating_adds_the_answer_in_the_format_only_where_it_is_missing():
    row = {"completion": "2 + 3 = 5. The answer is 5.", "prompt": ASKS, "messages": None,
           "answer": "5"}  # fmt: skip
    assert restate(row, "answer") == ("2 + 3 = 5. The answer is 5.\n<answer>5</answer>", True)
    tagged = {**row, "completion": "<answer>5</answer>"}
    assert restate(tagged, "answer") == ("<answer>5</answer>", False)
    assert restate({**row, "prompt": "What is 2 + 3?"}, "answer")[1] is False  # not asked
    assert restate({**row, "answer": None}, "answer")[1] is False  # nothing read
    # with an answer_format verdict, the verdict decides (its `when: always` asks everywhere)
    unasked = {**row, "prompt": "What is 2 + 3?"}
    assert restate({**unasked, "in_format": False}, "answer")[1] is True
    assert restate({**row, "in_format": True}, "answer")[1] is False


def test_a_replaying_round_restates_what_an_earlier_round_restated():
    from thresher.flows.bootstrap import restates_training

    data = yaml.safe_load((ROOT / "configs" / "bootstrap-rg-replay.yaml").read_text())
    replay = BootstrapConfig.model_validate(data)
    alone = BootstrapConfig.model_validate(data | {"train": data["train"] | {"all_rounds": False}})
    rounds = [{"restated": True}, {"restated": True}, {"restated": False}]
    # round 2's own model is in the format, but it replays rounds 0-1's restated answers
    assert restates_training(replay, rounds[:2], False) is True
    assert restates_training(alone, rounds[:2], False) is False  # trains on round 2's alone
    assert restates_training(replay, [{"restated": False}], False) is False
    assert restates_training(alone, [], True) is True
    assert replay.train_config(2, True).data.restate_format == "answer"


def test_task_answer_monitors_match_a_hand_count():
    answers = pl.DataFrame(
        {
            "prompt_id": ["a", "a", "b", "b", "c", "c", "d", "d"],
            "task": ["lc"] * 6 + ["gcd"] * 2,
            "kept": [True, True, True, False, False, False, True, False],
            "answer": ["1", "1.0", "1", "2", None, "3", "4", "5"],
            "reference": ["1", "1", "1", "1", "3", "3", "4", "4"],
        }
    )
    got = {r["task"]: r for r in task_answer_monitors(answers).iter_rows(named=True)}
    lc = got["lc"]
    # model answers 1, 1, 1, 2, 3 (one unread): "1" 3 of 5; kept 1, 1, 1: 1.0;
    # references (one per prompt) 1, 1, 3: "1" 2 of 3; excess 1 - 2/3
    assert (lc["model_top"], lc["model_top_share"]) == ("1", 0.6)
    assert (lc["kept_top"], lc["kept_top_share"]) == ("1", 1.0)
    assert (lc["reference_top"], lc["reference_top_share"]) == ("1", round(2 / 3, 4))
    assert lc["excess"] == round(1 - 2 / 3, 4) and lc["distinct_answers"] == 3
    assert got["gcd"]["excess"] == 0.0 and got["gcd"]["distinct_answers"] == 2
    monitors = {"answer_excess": lc["excess"]}
    assert check_monitors(monitors, MonitorsGateConfig(max_answer_excess=0.4)) == []
    assert check_monitors(monitors, MonitorsGateConfig(max_answer_excess=0.3)) == [
        "answer_excess 0.3333 is above max_answer_excess 0.3"
    ]


ENV = {
    "per_round": 6,
    "seed": 3,
    "curriculum": {"low": 0.2, "high": 0.6},
    "tasks": {
        "basic_arithmetic": {
            "levels": ARITHMETIC_LEVELS,
            "start": 1,
        },
        "chain_sum": {
            "levels": [{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}],
        },
    },
}


def _round_selection(lake, dataset: str, round_: int, passing: dict[str, tuple[int, int]]):
    """A curate run of pipeline `env` over round `round_`'s prompts: per task, `passed` of
    `n` candidates pass (spread over its prompts), written as the lake holds a round."""
    from thresher.stores.runs import record_run
    from thresher.stores.tables import write_candidates, write_selections

    prompts = lake.query("SELECT prompt_id, task FROM prompts WHERE dataset = ?", [dataset])
    cands, decisions = [], []
    for task, (passed, n) in passing.items():
        ids = prompts.filter(pl.col("task") == task)["prompt_id"].to_list()
        for i in range(n):
            cid = f"{task}-{round_}-{i}"
            cands.append({"candidate_id": cid, "prompt_id": ids[i % len(ids)], "round": round_,
                          "sample_idx": i, "text": "x", "n_tokens": 3,
                          "hinted": False})  # fmt: skip
            reason = None if i < passed else "failed"
            decisions.append(
                {"candidate_id": cid, "prompt_id": ids[i % len(ids)], "reason": reason}
            )
    write_candidates(lake, cands)
    sid = f"sel-{round_}"
    write_selections(lake, sid, round_, decisions, f"curate-{sid}")
    record_run(lake, f"curate-{sid}", flow="curate", round_=round_, model="m",
               config={"name": "env"}, status="completed", started_at=T0, finished=True,
               selection_id=sid)  # fmt: skip


def test_the_curriculum_raises_a_level_above_the_band_and_lowers_it_below(lake):
    from thresher.config.env import round_dataset
    from thresher.ingest.envs import generate_round

    env = EnvironmentConfig.model_validate(ENV)
    first = generate_round(lake, env, "gen", "env", 0)
    assert {t: p["level"] for t, p in first.items()} == {"basic_arithmetic": 1, "chain_sum": 0}
    meta = [json.loads(m) for m in lake.query("SELECT meta FROM prompts")["meta"]]
    assert {(m["generator"], m["level"], m["round"]) for m in meta} == {
        ("basic_arithmetic", 1, 0),
        ("chain_sum", 0, 0),
    }
    assert lake.count("prompts") == 12
    # round 0: basic_arithmetic passes 5 of 6 (above 0.6: harder), chain_sum 0 of 6
    # (below 0.2, but at its easiest level already)
    _round_selection(
        lake, round_dataset("gen", 0), 0, {"basic_arithmetic": (5, 6), "chain_sum": (0, 6)}
    )
    second = generate_round(lake, env, "gen", "env", 1)
    assert (
        second["basic_arithmetic"]["level"] == 2 and "harder" in second["basic_arithmetic"]["why"]
    )
    assert second["chain_sum"]["level"] == 0 and "easiest" in second["chain_sum"]["why"]
    # round 1: basic_arithmetic passes 1 of 6 (below the band): one level easier; and
    # round 2 at level 1 is again above... the hardest level says it is out of levels
    _round_selection(
        lake, round_dataset("gen", 1), 1, {"basic_arithmetic": (1, 6), "chain_sum": (3, 6)}
    )
    third = generate_round(lake, env, "gen", "env", 2)
    assert third["basic_arithmetic"]["level"] == 1 and "easier" in third["basic_arithmetic"]["why"]
    assert third["chain_sum"]["level"] == 0 and "band" in third["chain_sum"]["why"]
    # the report's frontier table: one candidate per prompt here, so a prompt is always or
    # never solved; the levels are the ones generated
    from thresher.evaluators.report import task_frontier_by_round

    table = {(r["round"], r["task"]): r for r in task_frontier_by_round(lake, "env").to_dicts()}
    ba = table[(0, "basic_arithmetic")]
    assert (ba["level"], ba["prompts"], ba["always"], ba["never"], ba["in_band"]) == (1, 6, 5, 1, 0)
    assert table[(1, "basic_arithmetic")]["level"] == 2
    assert table[(1, "chain_sum")]["pass_rate"] == 0.5
    # what the samples bought: 3 tokens a candidate, 5 of basic_arithmetic's 6 kept
    from thresher.evaluators.report import spend_by_round

    spend = {(r["round"], r["task"]): r for r in spend_by_round(lake, "env").to_dicts()}
    assert (spend[(0, "basic_arithmetic")]["tokens"], spend[(0, "basic_arithmetic")]["kept"]) == (
        18,
        5,
    )
    assert spend[(0, "basic_arithmetic")]["tokens_per_kept"] == 3.6
    assert (spend[(0, "all")]["tokens"], spend[(0, "all")]["kept"]) == (36, 5)
    assert spend[(0, "all")]["gain"] is None  # no evaluation here
    from thresher.evaluators.page import write_report

    page = write_report(lake, lake.root.parent / "report", "env").read_text()
    assert "<h2>Frontier</h2>" in page and 'alt="Curriculum levels"' in page
    # generating a round again adds nothing
    before = lake.count("prompts")
    generate_round(lake, env, "gen", "env", 2)
    assert lake.count("prompts") == before


def test_the_hardest_level_says_it_is_out_of_levels(lake):
    from thresher.config.env import round_dataset
    from thresher.ingest.envs import generate_round

    env = EnvironmentConfig.model_validate(
        {**ENV, "tasks": {"chain_sum": {"levels": ENV["tasks"]["chain_sum"]["levels"]}}}
    )
    generate_round(lake, env, "gen", "env", 0)
    _round_selection(lake, round_dataset("gen", 0), 0, {"chain_sum": (6, 6)})
    assert "out of levels" in generate_round(lake, env, "gen", "env", 1)["chain_sum"]["why"]


def test_generated_prompts_never_equal_an_eval_or_test_prompt(lake):
    from thresher.config.env import SEED_STRIDE
    from thresher.ingest.envs import EnvSpec, TaskSpec, generate, generate_round, ingest_env

    env = EnvironmentConfig.model_validate(
        {"per_round": 20, "seed": 5, "tasks": {"chain_sum": {"levels": [{"max_digits": 1}]}}}
    )
    # an eval split holding round 0's first ten generated questions
    same = EnvSpec(tasks={"chain_sum": TaskSpec(config={"max_digits": 1})}, size=10, seed=5)
    assert [r["prompt"] for r in generate(same)][:1]  # the spec generates
    ingest_env(lake, "reasoning-gym", same, "held", split="eval")
    plans = generate_round(lake, env, "gen", "env", 0)
    assert plans["chain_sum"]["held_out_clashes"] >= 10 and plans["chain_sum"]["seed"] == 5
    held = set(lake.query("SELECT prompt FROM prompts WHERE split = 'eval'")["prompt"])
    made = lake.query("SELECT prompt FROM prompts WHERE dataset = 'gen-round-0'")["prompt"]
    assert made.len() == 20 and not held & set(made)
    later = generate_round(lake, env, "gen", "env", 1)["chain_sum"]
    assert later["seed"] == 5 + SEED_STRIDE


def test_two_runs_are_compared_paired_over_their_common_prompts():
    from thresher.evaluators.compare import paired_difference

    def rates(round_: int, values: dict[str, float]) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "round": [round_] * len(values),
                "prompt_id": list(values),
                "task": ["t1" if p < "p3" else "t2" for p in values],
                "reference": ["1"] * len(values),
                "n": [1] * len(values),
                "c": [int(v) for v in values.values()],
                "rate": list(values.values()),
            }
        )

    a = pl.concat([rates(0, {"p1": 0, "p2": 0}), rates(3, {"p1": 1, "p2": 1, "p3": 1, "p4": 0})])
    b = rates(2, {"p1": 1, "p2": 0, "p3": 0, "p5": 1})  # p4, p5 are not common
    got = {r["task"]: r for r in paired_difference(a, b).to_dicts()}
    # common prompts p1, p2, p3: a's last model 1, 1, 1; b's 1, 0, 0
    assert (got["all"]["prompts"], got["all"]["difference"]) == (3, pytest.approx(2 / 3))
    assert (got["all"]["round_a"], got["all"]["round_b"]) == (3, 2)
    assert got["t1"]["difference"] == pytest.approx(0.5) and got["t2"]["difference"] == 1.0
    sd = (((0 - 2 / 3) ** 2 + 2 * (1 - 2 / 3) ** 2) / 2) ** 0.5
    assert got["all"]["low"] == pytest.approx(2 / 3 - 1.959963984540054 * sd / 3**0.5)
