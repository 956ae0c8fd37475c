"""`thresher rm-check`: a reward model's pairwise accuracy from a pairs file or the lake,
recorded in `runs`; and the gate a pipeline using the `reward` verifier passes before it runs."""

import json
import os

import pytest
from typer.testing import CliRunner

from thresher.config import SelectConfig
from thresher.evaluators.pairs import PairsError, lake_pairs, read_pairs
from thresher.flows.cli import app
from thresher.intervals import wilson_interval
from thresher.plan import RoundPlan
from thresher.selection.select import select_batch
from thresher.stores.runs import latest_rm_check, record_run
from thresher.verifiers.reward import RewardModel, RewardModelRejected, reward_model_gate

QUESTIONS = ["What is 2 + 3?", "What is 4 * 2?", "What is 9 - 1?", "What is 7 + 7?"]


def rm_check(*args: str):
    result = CliRunner().invoke(app, ["rm-check", *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def write_pairs(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def pair_rows() -> list[dict]:
    """Pairs in each accepted form, and one tie (the same answer twice)."""
    return [
        {"prompt": QUESTIONS[0], "chosen": " 5", "rejected": " 6"},
        {  # as `thresher export --format dpo` writes a plain prompt
            "prompt": [{"role": "user", "content": QUESTIONS[1]}],
            "chosen": [{"role": "assistant", "content": " 8"}],
            "rejected": [{"role": "assistant", "content": " I do not know."}],
        },
        {"prompt": QUESTIONS[2], "chosen": " 8", "rejected": " 9 - 1 = 10. The answer is 10."},
        {"prompt": QUESTIONS[3], "chosen": " 14", "rejected": " 14"},
    ]


def hand_accuracy(model: str) -> tuple[int, int]:
    """(correct, ties) of the pairs of pair_rows(), from RewardModel.scores directly."""
    plain = [
        (QUESTIONS[0], " 5", " 6"),
        (QUESTIONS[1], " 8", " I do not know."),
        (QUESTIONS[2], " 8", " 9 - 1 = 10. The answer is 10."),
        (QUESTIONS[3], " 14", " 14"),
    ]
    rows = [{"prompt": q, "messages": None, "text": t} for q, c, r in plain for t in (c, r)]
    scores = RewardModel(model).scores(rows)
    pairs = list(zip(scores[0::2], scores[1::2], strict=True))
    return sum(c > r for c, r in pairs), sum(c == r for c, r in pairs)


def test_pairs_file_accuracy_is_the_hand_computed_one(tiny_reward_model, lake, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs, pair_rows())
    correct, ties = hand_accuracy(tiny_reward_model)
    assert ties == 1
    low, high = wilson_interval(correct, 4)

    # a relative model path is recorded as the folder's absolute path
    cwd = os.getcwd()
    os.chdir(os.path.dirname(tiny_reward_model))
    try:
        rel = os.path.basename(tiny_reward_model)
        result = rm_check("--model", rel, "--pairs", str(pairs), "--lake", str(lake.root))
    finally:
        os.chdir(cwd)
    assert result.exit_code == 1, result.output  # a tie counts as wrong: below 0.85 anyway
    assert f"pairwise accuracy {correct / 4:.3f} [{low:.3f}, {high:.3f}]" in result.output
    assert "on 4 pairs" in result.output and "1 ties counted as wrong" in result.output

    run = lake.query("SELECT * FROM runs WHERE flow = 'rm-check'").to_dicts()
    assert len(run) == 1 and run[0]["status"] == "completed"
    assert run[0]["model"] == tiny_reward_model
    summary = json.loads(run[0]["summary"])
    assert summary["pairs"] == 4 and summary["ties"] == 1 and summary["correct"] == correct
    assert summary["accuracy"] == pytest.approx(correct / 4)
    assert (summary["low"], summary["high"]) == pytest.approx((low, high))
    assert summary["source"] == f"file {pairs.resolve()}"
    assert json.loads(run[0]["config"])["pairs"] == str(pairs.resolve())

    args = ["-m", tiny_reward_model, "--pairs", str(pairs), "--lake", str(lake.root)]
    result = rm_check(*args, "--min-accuracy", "0")
    assert result.exit_code == 0 and "meets the minimum 0.0" in result.output
    # --max-pairs reads the first lines only
    result = rm_check(*args, "--max-pairs", "3")
    assert "on 3 pairs" in result.output
    assert latest_rm_check(lake, tiny_reward_model)["pairs"] == 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2: not valid JSON"),
        ('{"prompt": "q", "chosen": "a"}', "line 2: missing rejected"),
        ('{"chosen": "a", "rejected": "b"}', "line 2: expected `prompt`"),
        ('{"prompt": "q", "chosen": 3, "rejected": "b"}', "line 2: chosen: expected text"),
        ("[1, 2]", "line 2: expected a JSON object"),
    ],
)
def test_a_malformed_line_is_an_error_naming_it(tmp_path, line, message):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(pair_rows()[0]) + "\n" + line + "\n")
    with pytest.raises(PairsError, match=message):
        read_pairs(pairs)


def test_pairs_forms(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    write_pairs(
        pairs,
        [
            *pair_rows()[:2],
            {"messages": convo, "chosen": "4", "rejected": "5"},
            # TRL's implicit prompt: the turns before the answer
            {
                "chosen": [*convo, {"role": "assistant", "content": "4"}],
                "rejected": [*convo, {"role": "assistant", "content": "5"}],
            },
        ],
    )
    got = read_pairs(pairs)
    assert [(p["prompt"], p["messages"], p["chosen"], p["rejected"]) for p in got[:2]] == [
        (QUESTIONS[0], None, " 5", " 6"),
        (QUESTIONS[1], None, " 8", " I do not know."),
    ]
    for p in got[2:]:
        assert p["prompt"] == "2+2?" and json.loads(p["messages"]) == convo
        assert (p["chosen"], p["rejected"]) == ("4", "5")
    assert [p["line"] for p in got] == [1, 2, 3, 4]


def test_bad_input_exits_2_without_a_traceback(tiny_reward_model, lake, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(pair_rows()[0]) + "\n\nnot json\n")
    cases = [
        (["-m", tiny_reward_model], "either --pairs FILE or --from-lake"),
        (["-m", tiny_reward_model, "--pairs", str(pairs), "--from-lake"], "either"),
        (["-m", tiny_reward_model, "--pairs", str(pairs)], "line 3: not valid JSON"),
        (["-m", tiny_reward_model, "--pairs", str(tmp_path / "nope.jsonl")], "no such file"),
        (["-m", str(tmp_path / "no-rm"), "--pairs", str(pairs)], "does not exist"),
        (["-m", tiny_reward_model, "--pairs", str(pairs), "--round", "1"], "go with --from-lake"),
        (["-m", tiny_reward_model, "--from-lake"], "no curated selection"),
        (["-m", tiny_reward_model, "--pairs", str(pairs), "--min-accuracy", "2"], "min-accuracy"),
    ]
    for args, message in cases:
        result = rm_check(*args, "--lake", str(lake.root))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    assert lake.count("runs") == 0  # bad input records no check
    # a folder that holds no reward model: the check is recorded as failed
    good = tmp_path / "good.jsonl"
    write_pairs(good, pair_rows())
    result = rm_check("-m", str(tmp_path), "--pairs", str(good), "--lake", str(lake.root))
    assert result.exit_code == 2 and "could not score with reward model" in result.output
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["failed"]


def seed_round(lake, passed: dict[str, list[bool]], round_: int = 0, hinted=()) -> None:
    """Prompts with one candidate per entry (passed or not), verified by `exact`, selected."""
    lake.append(
        "prompts",
        [
            {"prompt_id": p, "dataset": "d", "split": "train", "task": "t", "prompt": f"Q {p}?"}
            for p in passed
        ],
    )
    cands, verdicts = [], []
    for pid, flags in passed.items():
        for i, ok in enumerate(flags):
            cid = f"{pid}-r{round_}-{i}"
            cands.append(
                {
                    "candidate_id": cid,
                    "prompt_id": pid,
                    "round": round_,
                    "sample_idx": i,
                    "text": f"answer {i} of {pid} {'right' if ok else 'wrong'} {i * 'x'}",
                    "hinted": cid in hinted,
                }
            )
            verdicts.append(
                {"candidate_id": cid, "verifier": "exact", "score": float(ok), "passed": ok}
            )
    lake.append("candidates", cands)
    lake.append("verdicts", verdicts)
    ids = [c["candidate_id"] for c in cands]
    plan = RoundPlan(
        run_id=None, selection_id=f"sel-{round_}", round=round_, rule=None, verifiers=()
    )
    select_batch(lake, plan, SelectConfig(cap=8, near_dup=False), ids)


def test_lake_pairs_are_kept_against_failed_of_the_same_prompt(lake):
    seed_round(
        lake,
        {
            "p1": [True, True, False, False, False],  # 6 (kept, failed) pairs: 4 taken
            "p2": [True, False, False],  # 2 pairs, one of them with a hinted answer
            "p3": [False, False],  # nothing kept: no pair
            "p4": [True, True],  # nothing failed: no pair
        },
        hinted={"p2-r0-2"},
    )
    got = lake_pairs(lake, 0)
    assert len(got) == 5
    outcome = dict(
        lake.query("SELECT candidate_id, coalesce(drop_reason, 'kept') FROM selections").rows()
    )
    for p in got:
        assert outcome[p["chosen_id"]] == "kept" and outcome[p["rejected_id"]] == "failed"
        assert p["chosen_id"].split("-")[0] == p["rejected_id"].split("-")[0] == p["prompt_id"]
        assert p["prompt"] == f"Q {p['prompt_id']}?" and "right" in p["chosen"]
    assert sorted(p["prompt_id"] for p in got) == ["p1"] * 4 + ["p2"]
    assert len({(p["chosen_id"], p["rejected_id"]) for p in got}) == 5
    assert lake_pairs(lake, 0) == got  # a fixed order
    # the cap takes every prompt's first pair before any prompt's second
    assert sorted(p["prompt_id"] for p in lake_pairs(lake, 0, max_pairs=2)) == ["p1", "p2"]
    assert len(lake_pairs(lake, 0, per_prompt=1)) == 2
    assert lake_pairs(lake, 1) == [] and lake_pairs(lake, 0, name="other") == []


def test_rm_check_from_lake_records_the_run(tiny_reward_model, lake):
    seed_round(lake, {"p1": [True, False, False], "p2": [True, True, False]})
    seed_round(lake, {"p5": [True, False]}, round_=1)
    args = ["-m", tiny_reward_model, "--from-lake", "--lake", str(lake.root)]
    result = rm_check(*args, "--round", "0", "--min-accuracy", "0")
    assert result.exit_code == 0, result.output
    assert "on 4 pairs from lake round 0" in result.output
    check = latest_rm_check(lake, tiny_reward_model)
    assert check["pairs"] == 4 and check["source"] == "lake round 0"
    run = lake.query("SELECT round, config FROM runs WHERE run_id = ?", [check["run_id"]])
    assert run["round"][0] == 0 and json.loads(run["config"][0])["from_lake"] is True
    # default: the latest round
    result = rm_check(*args, "--min-accuracy", "0")
    assert "on 1 pairs from lake round 1" in result.output
    assert latest_rm_check(lake, tiny_reward_model)["pairs"] == 1
    result = rm_check(*args, "--round", "3")
    assert result.exit_code == 2 and "no prompt with both a kept and a failed" in result.output


def record_check(lake, model: str, accuracy: float, status: str = "completed", **summary):
    from thresher.stores.lake import now

    stamp = now()
    record_run(
        lake,
        f"check-{accuracy}-{status}",
        flow="rm-check",
        round_=0,
        model=model,
        config={},
        status=status,
        started_at=stamp,
        finished=True,
        summary={"accuracy": accuracy, "low": accuracy - 0.1, "high": accuracy + 0.05,
                 "pairs": 100, **summary},
    )  # fmt: skip


def test_the_gate_decision():
    with pytest.raises(RewardModelRejected, match="no pairwise accuracy recorded for reward model"):
        reward_model_gate("/m", None, 0.85, force=False)
    assert reward_model_gate("/m", None, 0.85, force=True)["forced"] is True
    check = {"accuracy": 0.53, "low": 0.45, "high": 0.61, "pairs": 200, "checked_at": "t0"}
    with pytest.raises(RewardModelRejected) as refused:
        reward_model_gate("/m", check, 0.85, force=False)
    assert "pairwise accuracy 0.53 [0.45, 0.61] on 200 pairs (< 0.85" in str(refused.value)
    assert "thresher rm-check at t0" in str(refused.value)
    assert "gates.force_reward_model: true" in str(refused.value)
    forced = reward_model_gate("/m", check, 0.85, force=True)
    assert forced["forced"] is True and forced["accuracy"] == 0.53
    passing = reward_model_gate("/m", check, 0.5, force=False)
    assert "forced" not in passing and passing["low"] == 0.45 and passing["checked_at"] == "t0"


def test_the_gate_reads_the_latest_completed_check(lake, tmp_path):
    from thresher.config import CurateConfig, VerifyConfig
    from thresher.flows.gates import pipeline_gates

    folder = tmp_path / "rm"
    folder.mkdir()
    cfg = CurateConfig(
        name="g",
        model="m",
        prompts={"dataset": "d"},
        verify={"verifiers": ["exact"], "by_task": {"t": ["reward"]},
                "options": {"reward": {"model": str(folder)}}},
    )  # fmt: skip
    assert pipeline_gates(lake, cfg.model_copy(update={"verify": VerifyConfig()})) is None
    with pytest.raises(RewardModelRejected, match=f"recorded for reward model {folder}"):
        pipeline_gates(lake, cfg)
    record_check(lake, str(folder), 0.9)
    record_check(lake, str(folder), 0.2, status="failed")
    record_check(lake, "/another", 0.2)
    assert pipeline_gates(lake, cfg)["accuracy"] == 0.9
    record_check(lake, str(folder), 0.6)
    with pytest.raises(RewardModelRejected, match="accuracy 0.60"):
        pipeline_gates(lake, cfg)
    low = cfg.gates.model_copy(update={"min_pairwise_accuracy": 0.5})
    assert pipeline_gates(lake, cfg.model_copy(update={"gates": low}))["accuracy"] == 0.6


def test_gate_settings_change_no_identity():
    from thresher.config import CurateConfig
    from thresher.identities import run_id_for, selection_id_for

    base = CurateConfig(name="g", model="m", prompts={"dataset": "d"})
    gated = CurateConfig(
        name="g",
        model="m",
        prompts={"dataset": "d"},
        gates={"min_pairwise_accuracy": 0.5, "force_reward_model": True},
    )
    capped = CurateConfig(name="g", model="m", prompts={"dataset": "d"}, select={"cap": 2})
    assert run_id_for(base) == run_id_for(gated) != run_id_for(capped)
    assert selection_id_for(base) == selection_id_for(gated) != selection_id_for(capped)
