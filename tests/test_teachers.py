"""Teachers, hints from verified solutions and the curriculum, against hand counts: the
teacher cap and share in selection, the copy rule, the difficulty classes, the counts per
source, and a level that moves on correctness alone (and on a probe of the next level)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
from helpers import ARITHMETIC_LEVELS, VERDICT_COLUMNS

from thresher.config import EnvironmentConfig, SelectConfig
from thresher.hints import copied_share, solution_hint
from thresher.selection.select import decide
from thresher.stores.runs import record_run
from thresher.stores.tables import write_candidates, write_selections, write_verdicts

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(prompt: str, i: int, source: str = "student", text: str | None = None, hint=None):
    return {
        "candidate_id": f"{prompt}-{source}-{i}",
        "prompt_id": prompt,
        "sample_idx": i,
        "text": text or f"answer {prompt} {source} {i} with words enough to differ",
        "n_tokens": 5,
        "finish_reason": "stop",
        "hinted": source != "student",
        "source": source,
        "hint": hint,
        "passed": True,
        "prompt": prompt,
        "messages": None,
        "has_tests": False,
        "task": "t",
        "reference": "1",
        "answer": str(i),
        "score": 1.0,
    }


def _reasons(rows: list[dict]) -> dict[str, str | None]:
    return {r["candidate_id"]: r["reason"] for r in rows}


def test_the_teacher_cap_per_prompt_and_its_share_of_a_batch():
    # prompt a: the student's own 2 pass; b: 3 of the teacher's; c: 2 of the teacher's
    rows = [_row("a", 0), _row("a", 1)]
    rows += [_row("b", i, "teacher:big") for i in range(3)]
    rows += [_row("c", i, "teacher:big") for i in range(2)]
    spec = SelectConfig(near_dup=False, cap=4, teacher_cap=1, max_teacher_share=0.5)
    decide(rows, spec)
    got = _reasons(rows)
    # by hand: one teacher candidate a prompt (b-1, b-2, c-1 over the cap); then of 2 own +
    # 2 teacher kept, the teacher's share 0.5 is allowed: 2 <= 0.5 * 2 / 0.5
    assert [c for c, r in got.items() if r == "teacher_share"] == [
        "b-teacher:big-1",
        "b-teacher:big-2",
        "c-teacher:big-1",
    ]
    assert sum(r is None for r in got.values()) == 4
    # a share of 0.25: 0.25 * 2 / 0.75 = 0.67 -> no teacher candidate stays
    rows = [_row("a", 0), _row("a", 1)] + [_row("b", i, "teacher:big") for i in range(3)]
    decide(rows, SelectConfig(near_dup=False, cap=4, teacher_cap=1, max_teacher_share=0.25))
    assert [r["reason"] for r in rows] == [None, None] + ["teacher_share"] * 3


def test_a_teacher_candidate_does_not_count_against_the_hinted_share():
    rows = [_row("a", 0), _row("b", 0, "hint:answer"), _row("c", 0, "teacher:big")]
    decide(rows, SelectConfig(near_dup=False, cap=4, teacher_cap=1), max_hinted_share=0.5)
    # one own, one hinted (0.5 of 2 allowed: 1), one teacher's (0.5 of 2: 2 allowed)
    assert [r["reason"] for r in rows] == [None, None, None]
    rows = [_row("a", 0), _row("b", 0, "hint:answer"), _row("b", 1, "hint:answer")]
    decide(rows, SelectConfig(near_dup=False, cap=4), max_hinted_share=0.5)
    assert [r["reason"] for r in rows] == [None, None, "hint_share"]


def test_a_solution_hint_stops_before_the_answer_and_the_copy_rule_counts_words():
    solution = "We add 12 and 30 to get 42. <answer>42</answer>"  # 9 words
    assert solution_hint(solution, 0.5, "42") == "We add 12 and"  # int(4.5) words
    # the whole solution asked for: it stops before the first word holding the answer
    assert solution_hint(solution, 1.0, "42") == "We add 12 and 30 to get"
    assert solution_hint("<answer>42</answer>", 1.0, "42") is None
    # an answer of several words is found in the text, not word by word
    assert solution_hint("x is 2 and y is 3 so (2, 3) is the point", 1.0, "(2, 3)") == (
        "x is 2 and y is 3 so"
    )
    hint = "We add 12 and 30 to get"
    # 7 of its 9 words lie in 3-grams of the hint: 0.778
    assert round(copied_share(solution, hint), 3) == 0.778
    # only the hint and an answer: 7 of 8
    assert copied_share(hint + " <answer>42</answer>", hint) == 7 / 8
    # its own words: none covered (a 3-gram shared only by chance counts its 3 words)
    assert copied_share("Twelve plus thirty is 42", hint) == 0.0
    rows = [
        _row("a", 0, "hint:solution", hint + " 42. <answer>42</answer>", hint),
        _row("a", 1, "hint:solution", hint + " <answer>42</answer>", hint),
        _row("a", 2, "hint:solution", "Twelve plus thirty: <answer>42</answer>", hint),
    ]
    decide(rows, SelectConfig(near_dup=False, cap=4, max_hint_copy=0.8))
    assert [r["reason"] for r in rows] == [None, "copies_hint", None]


def _candidates(lake, round_: int, plan: list[tuple[str, str, bool]], pipeline: str = "p"):
    """Write one curate run's candidates and selection: (prompt, source, passed) each."""
    cands, decisions = [], []
    for i, (prompt, source, passed) in enumerate(plan):
        cid = f"{pipeline}-{round_}-{i}"
        cands.append({"candidate_id": cid, "prompt_id": prompt, "round": round_,
                      "sample_idx": i, "text": "x", "n_tokens": 10 if source == "student" else 20,
                      "hinted": source != "student", "source": source})  # fmt: skip
        decisions.append(
            {"candidate_id": cid, "prompt_id": prompt, "reason": None if passed else "failed"}
        )
    write_candidates(lake, cands)
    sid = f"sel-{pipeline}-{round_}"
    write_selections(lake, sid, round_, decisions, f"curate-{sid}")
    record_run(lake, f"curate-{sid}", flow="curate", round_=round_, model="m",
               config={"name": pipeline}, status="completed", started_at=T0, finished=True,
               selection_id=sid)  # fmt: skip
    return [c["candidate_id"] for c in cands]


def test_difficulty_classes_and_counts_per_source_by_hand(lake):
    from thresher.evaluators.report import classes_by_round, sources_by_round
    from thresher.stores.queries import source_counts

    S, T, H = "student", "teacher:big", "hint:solution"
    _candidates(lake, 0, [
        ("p1", S, True), ("p1", S, False),                    # solved (0.5)
        ("p2", S, False), ("p2", S, False), ("p2", T, True),  # teachable
        ("p3", S, False), ("p3", T, False),                   # out of reach
        ("p4", S, False), ("p4", H, True),                    # out of reach: a hint is no one
    ])  # fmt: skip
    _candidates(lake, 1, [("p2", S, True), ("p3", S, False)])
    classes = {
        (r["round"], r["prompt_id"]): (r["class"], r["student_pass_rate"], r["teacher_pass_rate"])
        for r in lake.query("SELECT * FROM prompt_classes WHERE pipeline = 'p'").to_dicts()
    }
    assert classes == {
        (0, "p1"): ("solved", 0.5, None),
        (0, "p2"): ("teachable", 0.0, 1.0),
        (0, "p3"): ("out_of_reach", 0.0, 0.0),
        (0, "p4"): ("out_of_reach", 0.0, None),
        (1, "p2"): ("solved", 1.0, None),
        (1, "p3"): ("out_of_reach", 0.0, None),
    }
    by_round = classes_by_round(lake, "p").to_dicts()
    assert [(r["solved"], r["teachable"], r["out_of_reach"]) for r in by_round] == [
        (1, 1, 2),
        (1, 0, 1),
    ]
    assert by_round[0]["out_of_reach_share"] == 0.5
    profiles = lake.query(
        "SELECT source, count(*) AS prompts FROM difficulty_profiles WHERE round = 0 GROUP BY 1"
    ).rows()
    assert sorted(profiles) == [("student", 4), ("teacher:big", 2)]
    counts = source_counts(lake, "sel-p-0")
    # kept = passed here (no other drop): 1 own, 1 teacher's, 1 hinted
    assert counts["student"] == dict(candidates=6, passed=1, kept=1, tokens=60, kept_tokens=10)
    assert counts[T] == dict(candidates=2, passed=1, kept=1, tokens=40, kept_tokens=20)
    assert counts[H]["kept"] == 1
    per = {(r["round"], r["source"]): r["kept"] for r in sources_by_round(lake, "p").to_dicts()}
    assert per == {(0, H): 1, (0, S): 1, (0, T): 1, (1, S): 1}
    funnel = lake.query("SELECT * FROM round_funnel ORDER BY round").to_dicts()
    assert (funnel[0]["taught"], funnel[0]["kept_teacher"], funnel[0]["kept_teacher_tokens"]) == (
        2,
        1,
        20,
    )


ENV = {
    "per_round": 4,
    "seed": 3,
    "curriculum": {"low": 0.2, "high": 0.6, "probe": 2},
    "tasks": {
        "basic_arithmetic": {
            "levels": ARITHMETIC_LEVELS,
            "start": 1,
        },
    },
}


def _judged_round(lake, env, math: list[bool], probe_math: list[bool]) -> None:
    """Round 0's own candidates, one per prompt, every one failing the round's rule (the
    format), right by `math` (the probe prompts by `probe_math`)."""
    from thresher.config.env import round_dataset

    prompts = lake.query(
        "SELECT prompt_id, json_extract(meta, '$.probe')::BOOLEAN AS probe FROM prompts "
        "WHERE dataset = ? ORDER BY prompt_id",
        [round_dataset("gen", 0)],
    )
    main = prompts.filter(~pl.col("probe").fill_null(False))["prompt_id"].to_list()
    probes = prompts.filter(pl.col("probe").fill_null(False))["prompt_id"].to_list()
    assert (len(main), len(probes)) == (len(math), len(probe_math))
    plan = [(p, "student", False) for p in main + probes]
    ids = _candidates(lake, 0, plan, pipeline="env")
    right = math + probe_math
    verdicts = pl.DataFrame(
        [(c, "math", float(ok), ok, "", 1.0, None) for c, ok in zip(ids, right, strict=True)],
        schema=VERDICT_COLUMNS,
        orient="row",
    )
    write_verdicts(lake, verdicts, "d-math", "verify-run")
    fmt = verdicts.with_columns(verifier=pl.lit("answer_format"), passed=pl.lit(False))
    write_verdicts(lake, fmt, "d-format", "verify-run")


def test_the_level_moves_on_correctness_not_on_the_format(lake):
    from thresher.ingest.envs import generate_round

    env = EnvironmentConfig.model_validate(ENV | {"curriculum": {"low": 0.2, "high": 0.6}})
    generate_round(lake, env, "gen", "env", 0)
    _judged_round(lake, env, [True, True, True, False], [])  # right 3 of 4, format 0
    # read on the round's rule (the format failed every one): one level easier
    by_rule = generate_round(lake, env, "gen", "env", 1)["basic_arithmetic"]
    assert by_rule["level"] == 0 and "right 0.000" in by_rule["why"]
    # read on correctness alone: 0.75 > 0.6, one level harder
    judged = generate_round(lake, env, "gen", "env", 1, {"math": "d-math"})["basic_arithmetic"]
    assert judged["level"] == 2 and "right 0.750" in judged["why"] and "harder" in judged["why"]


def test_a_probe_of_the_next_level_raises_a_task_in_the_band(lake):
    from thresher.ingest.envs import generate_round
    from thresher.stores.queries import env_levels

    env = EnvironmentConfig.model_validate(ENV)
    plans = generate_round(lake, env, "gen", "env", 0)
    metas = [json.loads(m) for m in lake.query("SELECT meta FROM prompts")["meta"]]
    assert (
        sorted((m["level"], m.get("probe", False)) for m in metas)
        == [(1, False)] * 4 + [(2, True)] * 2
    )
    assert plans["basic_arithmetic"]["generated"] == 6
    assert env_levels(lake, "gen-round-0") == {"basic_arithmetic": 1}  # probes left out
    # in the band (2 of 4 right: 0.5), the probe of level 2 right 1 of 2 (>= 0.2): harder
    _judged_round(lake, env, [True, True, False, False], [True, False])
    up = generate_round(lake, env, "gen", "env", 1, {"math": "d-math"})["basic_arithmetic"]
    assert up["level"] == 2 and "probe of level 2 right 0.500" in up["why"]


def test_a_probe_the_student_fails_keeps_the_level(lake):
    from thresher.ingest.envs import generate_round

    env = EnvironmentConfig.model_validate(ENV)
    generate_round(lake, env, "gen", "env", 0)
    _judged_round(lake, env, [True, True, False, False], [False, False])
    same = generate_round(lake, env, "gen", "env", 1, {"math": "d-math"})["basic_arithmetic"]
    assert same["level"] == 1 and "same level" in same["why"]


def test_held_out_levels_match_the_eval_settings_to_a_level(lake):
    from thresher.ingest.envs import EnvSpec, TaskSpec, held_out_levels, ingest_env

    env = EnvironmentConfig.model_validate(ENV)
    level_1 = ENV["tasks"]["basic_arithmetic"]["levels"][1]
    spec = EnvSpec(tasks={"basic_arithmetic": TaskSpec(config=level_1)}, size=3, seed=9)
    ingest_env(lake, "reasoning-gym", spec, "held", split="eval")
    assert held_out_levels(lake, env, "held") == {"basic_arithmetic": 1}
    assert held_out_levels(lake, env, "nothing") == {}


def test_a_teacher_config_says_what_it_samples_and_its_ids_say_who():
    import pytest

    from thresher.config import CurateConfig, TeacherConfig
    from thresher.plan import plan_curate, plan_teacher

    cfg = CurateConfig(
        name="p",
        model="models/student",
        prompts={"dataset": "d"},
        sampling={"k": 4, "temperature": 0.8},
        teachers=[
            {"name": "big", "model": "models/big", "k": 2, "sampling": {"temperature": 0.2}},
            {"name": "again", "model": "student", "template": "Think first. {prompt}"},
        ],
    )
    big, again = (cfg.teacher_config(t) for t in cfg.teachers)
    assert (big.model, big.sampling.k, big.sampling.temperature) == ("models/big", 2, 0.2)
    assert (again.model, again.sampling.temperature) == ("models/student", 0.8)
    plan = plan_curate(cfg)
    own = plan_teacher(cfg, plan, cfg.teachers[1])
    # the student's own model sampled as a teacher: the same model, candidates of its own
    assert own.model_id == plan.model_id and own.params != plan.params
    assert own.params["source"] == "teacher:again" and own.params["template"].startswith("Think")
    with pytest.raises(ValueError, match="prompt"):
        TeacherConfig(name="t", model="m", template="no prompt here")
    with pytest.raises(ValueError, match="literal brace"):  # a few-shot \boxed{} unescaped
        TeacherConfig(name="t", model="m", template="Answer as \\boxed{x}. {prompt}")
    assert TeacherConfig(name="t", model="m", template="\\boxed{{x}}: {prompt}").template
    with pytest.raises(ValueError, match="below k"):
        TeacherConfig(name="t", model="m", k=4, budget=3)
    with pytest.raises(ValueError, match="differ"):
        CurateConfig(**cfg.model_dump() | {"teachers": [cfg.teachers[0]] * 2})


def test_a_resumed_round_takes_no_solution_from_a_later_round(lake):
    from thresher.stores.queries import passing_solutions

    ids = _candidates(lake, 0, [("p1", "teacher:big", True), ("p2", "student", False)])
    ids += _candidates(lake, 1, [("p2", "student", True)], pipeline="q")
    verdicts = pl.DataFrame(
        [
            (c, "math", 1.0, ok, "", 1.0, "7")
            for c, ok in zip(ids, [True, False, True], strict=True)
        ],
        schema=VERDICT_COLUMNS,
        orient="row",
    )
    write_verdicts(lake, verdicts, "d", "r")
    # round 0 (or its rerun after round 1 exists): only p1, the teacher's of round 0
    assert set(passing_solutions(lake, ["p1", "p2"], 0, None, {"math": "d"})) == {"p1"}
    later = passing_solutions(lake, ["p1", "p2"], 1, None, {"math": "d"})
    assert later["p2"]["source"] == "student" and later["p1"]["answer"] == "7"
