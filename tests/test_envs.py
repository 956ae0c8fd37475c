"""reasoning-gym environments as prompt sources, and the `reasoning_gym` verifier: every task
of the bundled configs on real entries, and the scorers' quirks."""

from __future__ import annotations

import json
import sys

import polars as pl
import pytest
import reasoning_gym
from typer.testing import CliRunner

from thresher.flows.cli import app
from thresher.ingest.envs import EnvSpec, generate, ingest_env, parse_spec
from thresher.ingest.load import IngestError
from thresher.verifiers import get_verifier

CONFIGS = ("configs/reasoning-gym/train.yaml", "configs/reasoning-gym/eval.yaml")
USED = sorted({t for path in CONFIGS for t in parse_spec(path).tasks})


def _task_spec(task: str) -> EnvSpec:
    for path in CONFIGS:
        spec = parse_spec(path)
        if task in spec.tasks:
            return EnvSpec(tasks={task: spec.tasks[task]}, size=6, seed=11)
    raise AssertionError(task)


def _batch(records: list[dict], texts: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "candidate_id": [f"c{i}" for i in range(len(texts))],
            "text": texts,
            "answer": [r["answer"] for r in records],
            "meta": [json.dumps(r["meta"]) for r in records],
        }
    )


def _wrong(answer: str) -> str:
    try:
        return str(int(answer) + 1)
    except ValueError:
        return answer[::-1] + "x"


@pytest.mark.parametrize("task", USED)
def test_every_configured_task_passes_its_reference_and_fails_a_wrong_answer(task):
    records = list(generate(_task_spec(task)))
    assert len(records) == 6
    assert all(r["task"] == task and r["meta"]["generator"] == task for r in records)
    good = [f"Let me see.\n<answer>{r['answer']}</answer>" for r in records]
    bad = [f"<answer>{_wrong(r['answer'])}</answer>" for r in records]
    verdicts = get_verifier("reasoning_gym").run(_batch(records + records, good + bad))
    assert verdicts["passed"].to_list() == [True] * 6 + [False] * 6, verdicts["reason"].to_list()
    assert all(f"by {task}'s scorer" in r for r in verdicts["reason"].to_list())


def test_rows_say_which_generator_config_and_seed_made_them():
    spec = parse_spec("chain_sum,leg_counting", size=3, seed=5, settings=["chain_sum.max_terms=2"])
    records = list(generate(spec))
    assert [r["task"] for r in records] == ["chain_sum"] * 3 + ["leg_counting"] * 3
    first = records[0]["meta"]
    assert first["env"] == "reasoning-gym" and first["seed"] == 5 and first["index"] == 0
    assert first["config"] == {"max_terms": 2}
    direct = reasoning_gym.create_dataset("chain_sum", size=3, seed=5, max_terms=2)[0]
    assert first["entry"]["question"] == direct["question"]
    assert records[0]["prompt"].startswith(direct["question"])
    assert "<answer>" in records[0]["prompt"]  # the instruction says where the answer goes


def test_ingest_keeps_entries_is_idempotent_and_repeats_across_splits_are_caught(lake):
    one_digit = ["chain_sum.min_terms=2", "chain_sum.max_terms=2", "chain_sum.max_digits=1"]
    spec = parse_spec("chain_sum", size=40, seed=3, settings=one_digit)
    first = ingest_env(lake, "reasoning-gym", spec, "rg")
    distinct = len({r["prompt"] for r in generate(spec)})
    assert first.ingested == distinct < 40  # one-digit sums repeat: one prompt each
    assert first.already_present == 40 - distinct
    again = ingest_env(lake, "reasoning-gym", spec, "rg")
    assert again.ingested == 0 and again.already_present == 40
    stored = lake.query("SELECT task, answer, meta, source FROM prompts")
    meta = json.loads(stored["meta"][0])
    assert meta["entry"]["answer"] == stored["answer"][0]
    assert stored["source"][0].startswith("reasoning-gym:")
    # the same generator on the next seed, as held-out prompts: reasoning-gym seeds entry i
    # with seed + i, so seed 4's entries are seed 3's shifted by one; the repeats are
    # refused (a question may not be both trained on and held out)
    held = spec.model_copy(update={"seed": 4})
    assert [r["prompt"] for r in generate(held)][:39] == [r["prompt"] for r in generate(spec)][1:]
    report = ingest_env(lake, "reasoning-gym", held, "rg", "eval")
    assert report.rejected > 0 and set(report.reasons) == {"conflicting duplicate"}
    reasons = lake.query("SELECT reason FROM rejects")["reason"].to_list()
    assert len(reasons) == report.rejected and all("split differs" in r for r in reasons)
    assert report.ingested + report.already_present + report.rejected == 40


def test_mixture_draws_tasks_by_weight():
    spec = parse_spec("chain_sum,leg_counting", size=200, seed=0)
    spec = spec.model_copy(update={"mixture": True})
    spec.tasks["chain_sum"].weight = 3.0
    tasks = [r["task"] for r in generate(spec)]
    assert len(tasks) == 200 and set(tasks) == {"chain_sum", "leg_counting"}
    assert 0.6 < tasks.count("chain_sum") / 200 < 0.9  # 3:1


def test_clear_errors_for_unknown_tasks_settings_and_a_missing_package(monkeypatch, tmp_path):
    with pytest.raises(IngestError, match="unknown reasoning-gym task"):
        list(generate(parse_spec("chain_sum,no_such_task")))
    with pytest.raises(IngestError, match="task.key=value"):
        parse_spec("chain_sum", settings=["max_terms=3"])
    with pytest.raises(IngestError, match="bad config"):
        list(generate(parse_spec("chain_sum", settings=["chain_sum.no_such_field=1"])))
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(IngestError, match=r"pip install 'thresher\[envs\]'"):
        list(generate(parse_spec("chain_sum")))


def test_cli_ingests_from_reasoning_gym_and_verifies_a_file(tmp_path):
    runner = CliRunner()
    lake_dir = str(tmp_path / "lake")
    args = ["ingest", "--from", "reasoning-gym", "chain_sum,leg_counting", "--size", "4"]
    ok = runner.invoke(app, [*args, "--seed", "2", "-d", "rg", "--lake", lake_dir])
    assert ok.exit_code == 0, ok.output
    assert "read 8 rows" in ok.output
    bad = runner.invoke(app, ["ingest", "chain_sum", "--size", "4", "-d", "rg", "--lake", lake_dir])
    assert bad.exit_code == 2 and "go with --from" in bad.output
    # a user's own answers, scored outside the lake: rows carry the prompt fields as stored
    records = list(generate(parse_spec("leg_counting", size=2, seed=2)))
    rows = [
        {"prompt": r["prompt"], "answer": r["answer"], "task": r["task"], "meta": r["meta"]}
        for r in records
    ]
    path = tmp_path / "answers.jsonl"
    path.write_text(
        json.dumps({**rows[0], "completion": f"<answer>{rows[0]['answer']}</answer>"})
        + "\n"
        + json.dumps({**rows[1], "completion": "<answer>1000</answer>"})
        + "\n"
    )
    out = runner.invoke(app, ["verify", str(path), "-v", "reasoning_gym"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [x["passed"] for x in lines] == [True, False]


# -- the scorers' quirks, each pinned ------------------------------------------------


def _entry(task: str, seed: int = 7, **config) -> dict:
    return next(iter(generate(EnvSpec(tasks={task: {"config": config}}, size=1, seed=seed))))


def test_partial_credit_is_a_score_not_a_pass_unless_min_score_says_so():
    record = _entry("leg_counting")
    text = f"<answer>{record['answer']} legs</answer>"  # contains the oracle: partial credit
    strict = get_verifier("reasoning_gym").run(_batch([record], [text])).row(0, named=True)
    assert 0 < strict["score"] < 1 and not strict["passed"]
    assert "passing needs 1" in strict["reason"]
    lenient = get_verifier("reasoning_gym", {"min_score": 0.1}).run(_batch([record], [text]))
    assert lenient["passed"][0]


def test_whitespace_the_default_scorer_would_punish_is_stripped_by_extraction():
    record = _entry("leg_counting")
    ds = reasoning_gym.create_dataset("leg_counting", size=1, seed=7)
    assert ds.score_answer(record["answer"] + " ", record["meta"]["entry"]) < 1  # no strip
    text = f"<answer> {record['answer']} \n</answer>"
    assert get_verifier("reasoning_gym").run(_batch([record], [text]))["passed"][0]


def test_gsm_symbolic_scorer_quirks_and_the_rule_that_guards_them():
    # an entry with a whole-number answer (some answers are decimals, e.g. 1687.5)
    record = next(
        r for seed in range(7, 60) if (r := _entry("gsm_symbolic", seed))["answer"].isdigit()
    )
    answer = record["answer"]
    signed = f"<answer>-{answer}</answer>"  # the scorer ignores the sign
    first = f"<answer>{answer} or maybe {int(answer) + 7}</answer>"  # it takes the first number
    batch = _batch([record, record], [signed, first])
    rg = get_verifier("reasoning_gym").run(batch)
    assert rg["passed"].to_list() == [True, True]  # reasoning-gym's own verdicts: both pass
    both = pl.concat([rg, get_verifier("math").run(batch)])
    math = both.filter(pl.col("verifier") == "math")["passed"].to_list()
    assert math == [False, False]  # thresher's math check fails both: `math and reasoning_gym`
    comma = {**record, "answer": "2744", "meta": {**record["meta"]}}
    comma["meta"]["entry"] = {**record["meta"]["entry"], "answer": "2744"}
    batch = _batch([comma], ["<answer>2,744</answer>"])
    got = pl.concat([get_verifier(n).run(batch) for n in ("reasoning_gym", "math")])
    by = dict(zip(got["verifier"], got["passed"], strict=True))
    assert by == {"reasoning_gym": False, "math": True}  # the scorer fails "2,744"


def test_a_scorer_that_raises_is_a_failed_verdict_with_the_exception():
    record = _entry("prime_factorization")
    got = get_verifier("reasoning_gym").run(
        _batch([record], ["<answer>The answer is 139</answer>"])
    )
    row = got.row(0, named=True)
    assert not row["passed"] and row["score"] == 0
    assert "prime_factorization's scorer raised ValueError" in row["reason"]


def test_without_tags_thresher_finds_the_answer_and_says_so():
    record = _entry("chain_sum", min_terms=2, max_terms=2)
    text = f"The sum works out. The answer is {record['answer']}."
    row = get_verifier("reasoning_gym").run(_batch([record], [text])).row(0, named=True)
    assert row["passed"] and "no <answer> tags; thresher's answer finding" in row["reason"]
    # the last number without the comma after it (a model's "6, which is ...")
    said = f"The sum of them is {record['answer']}, which I checked."
    assert get_verifier("reasoning_gym").run(_batch([record], [said]))["passed"][0]
    none = get_verifier("reasoning_gym").run(_batch([record], ["I do not know."]))
    assert not none["passed"][0] and "no answer found" in none["reason"][0]


def test_a_prompt_without_an_entry_cannot_be_judged_and_fails():
    batch = pl.DataFrame(
        {"candidate_id": ["a"], "text": ["<answer>4</answer>"], "answer": ["4"], "meta": ["{}"]}
    )
    row = get_verifier("reasoning_gym").run(batch).row(0, named=True)
    assert not row["passed"] and row["reason"].startswith("cannot judge")
