"""The parts of a bootstrap round that need no engine: difficulty plans, hints, the
hinted share, pass rates measured in earlier rounds, and the per-round configs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from thresher.config import BootstrapConfig, RationalizeConfig, SelectConfig
from thresher.samplers.difficulty import hinted_prompt, plan_k
from thresher.selection.select import decide
from thresher.stores.export import sft_rows
from thresher.stores.queries import last_pass_rates, unsolved_prompts

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def test_plan_skips_solved_and_gives_hard_prompts_more():
    rates = {"solved": 1.0, "easy": 0.9, "mid": 0.5, "hard": 0.1, "never": 0.0}
    ids = [*rates, "new"]
    plan = plan_k(ids, 8, rates, skip_solved_above=0.9, hard_below=0.25, hard_k=16)
    assert plan == {"solved": 0, "easy": 0, "mid": 8, "hard": 16, "never": 16, "new": 8}
    assert plan_k(ids, 8, rates) == dict.fromkeys(ids, 8)  # no difficulty settings
    only_skip = plan_k(ids, 4, rates, skip_solved_above=1.0)
    assert only_skip["solved"] == 0 and only_skip["easy"] == 4 and only_skip["hard"] == 4


def test_hint_goes_into_the_prompt_or_the_last_user_message():
    template = RationalizeConfig().hint
    prompt, msgs = hinted_prompt(template, "What is 2 + 3?", None, answer="5")
    assert msgs is None and prompt == "What is 2 + 3? (Hint: the answer is 5.)"
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    prompt, msgs = hinted_prompt("{prompt}\nAnswer: {answer}", None, chat, answer="5")
    assert prompt is None
    assert msgs == [chat[0], {"role": "user", "content": "What is 2 + 3?\nAnswer: 5"}]
    assert chat[1]["content"] == "What is 2 + 3?"  # the stored prompt is not changed
    with pytest.raises(ValueError, match="answer"):
        RationalizeConfig(hint="{prompt} please")


def _row(prompt: str, idx: int, passed: bool, hinted: bool = False) -> dict:
    return {
        "candidate_id": f"{prompt}-{'h' if hinted else 'u'}{idx}",
        "prompt_id": prompt,
        "sample_idx": idx,
        "text": f"answer number {idx} for {prompt} {'hinted' if hinted else 'plain'} text",
        "n_tokens": 5,
        "hinted": hinted,
        "prompt": f"question {prompt}",
        "messages": None,
        "passed": passed,
        "score": 1.0 if passed else 0.0,
    }


def test_hinted_share_caps_hinted_candidates_per_batch():
    def batch():
        rows = [_row(p, i, True) for p in ("a", "b", "c") for i in range(1)]
        rows += [_row(p, i, i == 0, hinted=True) for p in ("d", "e", "f", "g") for i in range(2)]
        return sorted(rows, key=lambda r: (r["prompt_id"], r["hinted"], r["sample_idx"]))

    # 3 plain kept; a hinted share of 0.5 allows 3 hinted, 0.25 allows 1 (3 * 0.25 / 0.75)
    for share, allowed in ((0.5, 3), (0.25, 1), (None, 4)):
        rows = batch()
        settings = SelectConfig(cap=4, near_dup=False, policy="first")
        decide(rows, settings, max_hinted_share=share)
        kept_hinted = [r for r in rows if r["hinted"] and r["reason"] is None]
        assert len(kept_hinted) == allowed
        over = [r for r in rows if r["reason"] == "hint_share"]
        assert len(over) == 4 - allowed and all(r["hinted"] for r in over)
        assert all(r["reason"] is None for r in rows if not r["hinted"])
        assert sum(r["reason"] == "failed" for r in rows) == 4


def _curated(lake, name: str, round_: int, outcomes: dict[str, list[bool]], hinted=()) -> None:
    """A completed curate run of pipeline `name` with one selection per candidate."""
    run_id = f"{name}-{round_}"
    cands, sels, verdicts = [], [], []
    for prompt_id, passes in outcomes.items():
        for i, ok in enumerate(passes):
            is_hinted = prompt_id in hinted and i == len(passes) - 1
            cid = f"{run_id}-{prompt_id}-{i}"
            cands.append(
                {
                    "candidate_id": cid,
                    "prompt_id": prompt_id,
                    "run_id": run_id,
                    "round": round_,
                    "model": "m",
                    "sample_idx": i,
                    "text": f"text {cid}",
                    "n_tokens": 3,
                    "finish_reason": "stop",
                    "hinted": is_hinted,
                    "created_at": T0,
                }
            )
            verdicts.append(
                {
                    "candidate_id": cid,
                    "verifier": "math",
                    "score": float(ok),
                    "passed": ok,
                    "reason": "",
                    "run_id": run_id,
                    "created_at": T0,
                }
            )
            sels.append(
                {
                    "round": round_,
                    "candidate_id": cid,
                    "prompt_id": prompt_id,
                    "kept": ok,
                    "drop_reason": None if ok else "failed",
                    "run_id": run_id,
                    "created_at": T0,
                }
            )
    lake.append("candidates", cands)
    lake.append("verdicts", verdicts)
    lake.append("selections", sels)
    lake.append(
        "runs",
        [
            {
                "run_id": run_id,
                "flow": "curate",
                "round": round_,
                "model": "m",
                "config": json.dumps({"name": name}),
                "status": "completed",
                "summary": "{}",
                "started_at": T0,
                "finished_at": T0,
                "updated_at": T0,
            }
        ],
    )
    lake.append(
        "prompts",
        [
            {"prompt_id": p, "dataset": "d", "split": "train", "task": "t", "prompt": f"q {p}"}
            for p in outcomes
        ],
    )


def test_pass_rates_come_from_the_latest_earlier_round_of_the_same_pipeline(lake):
    _curated(lake, "star", 0, {"a": [True, False], "b": [False, False], "c": [True, True]})
    # round 1 re-measures a (the hinted pass does not count) and skips c
    _curated(lake, "star", 1, {"a": [True, True, True], "b": [False, False, True]}, hinted={"b"})
    _curated(lake, "other", 1, {"a": [False, False]})
    assert last_pass_rates(lake, "star", 1) == {"a": 0.5, "b": 0.0, "c": 1.0}
    assert last_pass_rates(lake, "star", 2) == {"a": 1.0, "b": 0.0, "c": 1.0}
    assert last_pass_rates(lake, "star", 0) == {}
    assert last_pass_rates(lake, "other", 5) == {"a": 0.0}
    # b's only pass in round 1 was hinted: it is still unsolved for rationalization
    assert unsolved_prompts(lake, _ids(lake, "star-1")) == ["b"]
    assert unsolved_prompts(lake, _ids(lake, "star-0")) == ["b"]


def _ids(lake, run_id):
    sql = "SELECT candidate_id FROM candidates WHERE run_id = ?"
    return lake.query(sql, [run_id])["candidate_id"].to_list()


def test_training_rows_can_be_limited_to_one_pipeline(lake):
    _curated(lake, "star", 0, {"a": [True, False]})
    _curated(lake, "other", 0, {"b": [True, True]})
    assert {r["prompt_id"] for r in sft_rows(lake, 0, True, "star")} == {"a"}
    assert {r["prompt_id"] for r in sft_rows(lake, 0, True)} == {"a", "b"}
    assert sft_rows(lake, 0, True, "nobody") == []


BOOT = {
    "name": "star",
    "base_model": "/models/base",
    "prompts": {"dataset": "d"},
    "sampling": {"k": 4, "temperature": 0.8, "seed": 3},
    "train": {"method": "full", "epochs": 2, "all_rounds": False},
    "eval": {"prompts": {"dataset": "d", "split": "eval"}, "n": 4, "ks": [1, 4], "top_p": 0.95},
}


def test_bootstrap_config_builds_each_step():
    cfg = BootstrapConfig(**BOOT)
    cur = cfg.curate_config(2, "/models/r2")
    assert (cur.name, cur.model, cur.round, cur.sampling.k) == ("star", "/models/r2", 2, 4)
    tr = cfg.train_config(2)
    assert (tr.round, tr.base_model, tr.method, tr.epochs) == (2, "/models/base", "full", 2)
    assert (tr.data.round, tr.data.all_rounds, tr.data.pipeline) == (2, False, "star")
    ev = cfg.eval_config(3, "/models/r3")
    assert (ev.round, ev.n, ev.sampling.k, ev.prompts.split) == (3, 4, 4, "eval")
    # same engine seed as curation (one engine serves both), eval's own top_p
    assert (ev.sampling.seed, ev.sampling.temperature, ev.sampling.top_p) == (3, 0.8, 0.95)
    with pytest.raises(ValueError, match="held out"):
        BootstrapConfig(**{**BOOT, "eval": {"prompts": {"dataset": "d", "split": "train"}}})
    with pytest.raises(ValueError, match="n >= 8"):
        BootstrapConfig(**{**BOOT, "eval": {**BOOT["eval"], "ks": [1, 8]}})
    with pytest.raises(ValueError, match="hard_k"):
        BootstrapConfig(**BOOT, difficulty={"hard_below": 0.2})


@pytest.mark.parametrize(
    "pass1, best_round, tolerance, source",
    [
        ([0.2], 0, 0.02, 0),  # model 0 samples round 0
        ([0.2, 0.3], 1, 0.02, 1),  # improved: the newest samples
        ([0.2, 0.19], 0, 0.02, 1),  # within tolerance: still the newest
        ([0.2, 0.1], 0, 0.02, 0),  # regressed: back to the best
        ([0.2, 0.1, 0.15], 0, 0.02, 0),  # still below the best
        ([0.2, 0.1, 0.3], 2, 0.02, 2),
        ([0.2, 0.1], 0, None, 1),  # rollback off
    ],
)
def test_a_regressed_model_hands_sampling_back_to_the_best(pass1, best_round, tolerance, source):
    from thresher.flows.rounds import sampling_model_round

    assert sampling_model_round(pass1, best_round, tolerance) == source


def test_prompts_failing_retire_after_rounds_in_a_row_are_not_sampled_again(lake):
    from thresher.config import CurateConfig
    from thresher.samplers.stage import retired_prompts, sampling_plan
    from thresher.stores.queries import retired_prompts as streaks

    # a: fails rounds 0 and 1; b: fails 0, passes 1; c: passes 0, fails 1; d: fails 0, and
    # its only pass in round 1 is hinted (a hint's pass is no signal of its own)
    _curated(lake, "star", 0, {"a": [False] * 2, "b": [False] * 2, "c": [True, False],
                               "d": [False] * 2})  # fmt: skip
    _curated(lake, "star", 1, {"a": [False] * 2, "b": [False, True], "c": [False] * 2,
                               "d": [False, True]}, hinted={"d"})  # fmt: skip
    _curated(lake, "other", 1, {"b": [False] * 2})  # another pipeline's rounds do not count
    assert streaks(lake, "star", 2, 2) == {"a", "d"}
    assert streaks(lake, "star", 2, 1) == {"a", "c", "d"}
    assert streaks(lake, "star", 1, 2) == set()  # only round 0 before round 1
    assert streaks(lake, "other", 2, 1) == {"b"}
    cfg = CurateConfig(
        name="star",
        model="m",
        round=2,
        prompts={"dataset": "d"},
        sampling={"k": 4},
        difficulty={"retire_after": 2},
    )
    retired = retired_prompts(lake, cfg)
    assert retired == {"a", "d"}
    assert sampling_plan(lake, cfg, ["a", "b", "c", "d", "new"], retired) == {
        "a": 0, "b": 4, "c": 4, "d": 0, "new": 4,
    }  # fmt: skip
    # too early to have failed twice in a row; off unless set
    assert retired_prompts(lake, cfg.model_copy(update={"round": 1})) == set()
    unset = cfg.model_copy(
        update={"difficulty": cfg.difficulty.model_copy(update={"retire_after": None})}
    )
    assert retired_prompts(lake, unset) == set()
    # the views: every prompt's streak, and what the pipeline's latest curate run retired
    rows = lake.query("SELECT prompt_id, failing_rounds FROM fail_streaks WHERE pipeline = 'star'")
    assert dict(rows.iter_rows()) == {"a": 2, "b": 0, "c": 1, "d": 2}
    lake.append(
        "runs",
        [{"run_id": "star-2", "flow": "curate", "round": 2, "model": "m",
          "config": json.dumps({"name": "star", "difficulty": {"retire_after": 2}}),
          "status": "running", "started_at": T0.replace(year=2026), "updated_at": T0}],
    )  # fmt: skip
    listed = lake.query("SELECT * FROM retired_prompts WHERE pipeline = 'star'").to_dicts()
    assert [(r["prompt_id"], r["failing_rounds"], r["retire_after"]) for r in listed] == [
        ("a", 2, 2),
        ("d", 2, 2),
    ]


def test_band_share_counts_prompts_solved_sometimes(lake):
    from thresher.stores.queries import band_share

    outcomes = {"none": [False] * 4, "one": [True, False, False, False],
                "half": [True, True, False, False], "all": [True] * 4}  # fmt: skip
    _curated(lake, "star", 0, outcomes)
    default = band_share(lake, "star-0", 0.0, 1.0)
    assert (default["prompts"], default["in_band"], default["share"]) == (4, 2, 0.5)
    narrow = band_share(lake, "star-0", 0.3, 0.9)  # only "half" (0.5); 0.25 is below
    assert (narrow["in_band"], narrow["share"]) == (1, 0.25)


def test_band_and_unset_retire_after_leave_identities_alone():
    from thresher.identities import bootstrap_run_id, run_id_for, selection_id_for

    cfg = BootstrapConfig(**BOOT)
    band = BootstrapConfig(**BOOT, difficulty={"min_pass_rate": 0.1, "max_pass_rate": 0.9})
    checked = BootstrapConfig(
        **{**BOOT, "eval": {**BOOT["eval"], "also": [{"dataset": "general", "max_drop": 0.05}]}}
    )
    retire = BootstrapConfig(**BOOT, difficulty={"retire_after": 2})
    assert bootstrap_run_id(cfg) == bootstrap_run_id(band) == bootstrap_run_id(checked)
    assert bootstrap_run_id(retire) != bootstrap_run_id(cfg)
    cur, cur_band = cfg.curate_config(1, "m"), band.curate_config(1, "m")
    assert run_id_for(cur) == run_id_for(cur_band)
    assert selection_id_for(cur) == selection_id_for(cur_band)
    assert selection_id_for(retire.curate_config(1, "m")) != selection_id_for(cur)


def test_forgetting_checks_are_held_out_evaluations_of_their_own():
    also = {"dataset": "general", "max_drop": 0.05, "verify": {"verifiers": ["exact"]}}
    cfg = BootstrapConfig(**{**BOOT, "eval": {**BOOT["eval"], "also": [also]}})
    ev = cfg.forgetting_eval_config(0, 2, "/models/r2")
    assert (ev.name, ev.round, ev.model) == ("star~general/eval", 2, "/models/r2")
    assert (ev.prompts.dataset, ev.prompts.split, ev.n, ev.ks) == ("general", "eval", 4, [1, 4])
    assert ev.verify.verifiers == ["exact"]
    default = BootstrapConfig(**{**BOOT, "eval": {**BOOT["eval"], "also": [{"dataset": "g"}]}})
    assert default.forgetting_eval_config(0, 1, "m").verify == default.eval_verify()
    for bad, match in [
        ({"dataset": "d", "split": "train"}, "train on"),  # the training prompts
        ({"dataset": "g", "split": "test"}, "sealed"),
        ({"dataset": "g", "verify": {"verifiers": ["majority"]}}, "without a reference"),
    ]:
        with pytest.raises(ValueError, match=match):
            BootstrapConfig(**{**BOOT, "eval": {**BOOT["eval"], "also": [bad]}})
    with pytest.raises(ValueError, match="twice"):
        BootstrapConfig(**{**BOOT, "eval": {**BOOT["eval"], "also": [also, also]}})


def test_the_forgetting_gate_stops_on_a_drop_over_max_drop():
    from thresher.flows.gates import ForgettingGateFailed, GateAt, GateFailed, forgetting_gate

    cfg = BootstrapConfig(**BOOT)
    held = [{"check": "g/eval", "pass@1": 0.40, "base_pass@1": 0.45, "drop": 0.05,
             "max_drop": 0.05}]  # fmt: skip
    forgetting_gate(GateAt(None, cfg, 1, checks=held))  # a drop of exactly max_drop holds
    forgetting_gate(
        GateAt(None, cfg, 1, checks=[{**held[0], "drop": 0.3, "max_drop": None}])
    )  # measured only
    lost = [*held, {"check": "h/eval", "pass@1": 0.2, "base_pass@1": 0.5, "drop": 0.3,
                    "max_drop": 0.1}]  # fmt: skip
    with pytest.raises(ForgettingGateFailed) as stopped:
        forgetting_gate(GateAt(None, cfg, 2, checks=lost))
    assert isinstance(stopped.value, GateFailed)
    line = str(stopped.value)
    assert "\n" not in line and "h/eval" in line and "g/eval" not in line
    assert "model 2 scores pass@1 0.200" in line and "0.500" in line and "max_drop 0.1" in line
