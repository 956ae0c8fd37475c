"""The asked format and the answer prior on the real engine with the tests' tiny model:
a right answer outside the asked format is not kept, answer balance holds a skewed answer
to its reference share, the restate remedy raises the model's format share, and an
environment round moves each task's level by its hand-counted pass rate."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from helpers import full_training

from thresher.answers import answer_key
from thresher.config import BootstrapConfig, CurateConfig
from thresher.flows.bootstrap import run_bootstrap
from thresher.flows.curate import run_curate
from thresher.ingest.load import ingest
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
# in a system message: the tiny model reads its user turn as it was trained to
ASK = "Give the final answer between <answer> and </answer> tags."
ENGINE = {"dtype": "float32", "max_model_len": 256}


def _asking(src: Path, out: Path, keep=lambda row: True) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    out.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "system", "content": ASK},
                        {"role": "user", "content": r["question"]},
                    ],
                    "answer": r["answer"],
                }
            )
            + "\n"
            for r in rows
            if keep(r)
        )
    )
    return out


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    """Arithmetic prompts that ask for <answer> tags (train and eval), and a skewed set:
    every product with a zero factor (reference 0) and as many other prompts in all as
    make 0 the reference of 60 % of them."""
    tmp = tmp_path_factory.mktemp("frontier")
    lake = Lake(tmp / "lake")
    for split in ("train", "eval"):
        path = _asking(EXAMPLES / f"{split}.jsonl", tmp / f"{split}.jsonl")
        ingest(lake, path, dataset="arith", split=split, task="arithmetic")
        ingest(lake, EXAMPLES / f"{split}.jsonl", dataset="plain", split=split,
               mapping={"prompt": "question"}, task="arithmetic")  # fmt: skip
    every = [json.loads(line) for line in (EXAMPLES / "train.jsonl").read_text().splitlines()]
    zeros = [r for r in every if r["answer"] == "0"]
    others = [r for r in every if r["answer"] != "0"][: len(zeros) * 2 // 3]
    skewed = tmp / "skewed.jsonl"
    skewed.write_text("".join(json.dumps(r) + "\n" for r in zeros + others))
    ingest(lake, skewed, dataset="skewed", mapping={"prompt": "question"}, task="arithmetic")
    return lake


def _curate(lake: Lake, tiny_model, dataset: str, **sections) -> dict:
    cfg = CurateConfig(
        name=f"frontier-{dataset}",
        model=str(tiny_model),
        batch_size=64,
        prompts={"dataset": dataset},
        engine=ENGINE,
        **{
            "sampling": {"k": 6, "max_tokens": 24, "temperature": 1.0, "top_p": 1.0},
            "select": {"decontaminate": {"exact": True}},
        }
        | sections,
    )
    return run_curate(cfg, lake.root, progress=False)


def _kept_answers(lake: Lake, selection_id: str) -> pl.DataFrame:
    return lake.query(
        """SELECT s.kept, s.drop_reason, p.answer AS reference,
                  (SELECT max(v.answer) FROM verdicts v WHERE v.verifier = 'math'
                   AND v.candidate_id = s.candidate_id) AS answer
           FROM selections s JOIN prompts p USING (prompt_id) WHERE s.selection_id = ?""",
        [selection_id],
    )


def test_a_right_answer_outside_the_asked_format_is_not_kept(lake, tiny_model):
    lenient = _curate(lake, tiny_model, "arith", verify={"verifiers": ["math"]})
    strict = _curate(lake, tiny_model, "arith", verify={"verifiers": ["math", "answer_format"]})
    assert strict["sampled_now"] == 0  # the same candidates, judged again
    by = {}
    for name, summary in (("lenient", lenient), ("strict", strict)):
        by[name] = _kept_answers(lake, summary["selection_id"])
    right = lake.query(
        """SELECT count(DISTINCT m.candidate_id) FROM verdicts m JOIN verdicts f
           USING (candidate_id) WHERE m.verifier = 'math' AND m.passed
           AND f.verifier = 'answer_format' AND NOT f.passed"""
    )[0, 0]
    assert right > 0  # the tiny model answers right, never in the tags
    assert by["lenient"]["kept"].sum() > 0
    kept_strict = lake.query(
        """SELECT count(*) FROM selections s JOIN verdicts f USING (candidate_id)
           WHERE s.selection_id = ? AND s.kept AND f.verifier = 'answer_format'
           AND NOT f.passed""",
        [strict["selection_id"]],
    )[0, 0]
    assert kept_strict == 0


def test_answer_balance_holds_a_skewed_answer_to_its_reference_share(lake, tiny_model):
    margin = 0.05
    plain = {"cap": 6, "near_dup": False, "policy": "first", "decontaminate": {"exact": True}}
    off = _curate(lake, tiny_model, "skewed", verify={"verifiers": ["math"]}, select=plain)
    on = _curate(
        lake,
        tiny_model,
        "skewed",
        verify={"verifiers": ["math"]},
        select={**plain, "answer_balance": margin},
    )
    refs = lake.query("SELECT answer FROM prompts WHERE dataset = 'skewed'")["answer"]
    share = (refs == "0").mean()
    assert 0.55 <= share <= 0.65
    counts = {}
    for name, summary in (("off", off), ("on", on)):
        rows = _kept_answers(lake, summary["selection_id"]).filter(pl.col("kept"))
        zero = sum(answer_key(a) == "0" for a in rows["answer"].to_list())
        counts[name] = (zero, rows.height)
    zero_on, kept_on = counts["on"]
    assert kept_on > 0 and zero_on / kept_on <= share + margin + 1e-9
    zero_off, kept_off = counts["off"]
    assert zero_off / kept_off > share + margin  # the tiny model favours x * 0 = 0
    dropped = _kept_answers(lake, on["selection_id"]).filter(
        pl.col("drop_reason").str.starts_with("answer_share")
    )
    # exactly the excess zeros went as zeros; another answer over its own share in a
    # batch (a prompt answered right six times) may go too, each under its own name
    pairs = zip(dropped["answer"].to_list(), dropped["drop_reason"].to_list(), strict=True)
    assert all(r == f"answer_share:{answer_key(a)}" for a, r in pairs)
    dropped_zero = sum(answer_key(a) == "0" for a in dropped["answer"].to_list())
    assert dropped_zero == zero_off - zero_on
    assert dropped.height == kept_off - kept_on  # nothing else kept differs
    funnel = lake.query("SELECT sum(answer_share) FROM round_funnel")[0, 0]
    assert funnel >= dropped.height


def test_the_restate_remedy_raises_the_format_share_over_a_round(lake, tiny_model, tmp_path):
    cfg = BootstrapConfig.model_validate(
        {
            "name": "restate",
            "base_model": str(tiny_model),
            "batch_size": 64,
            "max_rounds": 1,
            "min_gain": -1.0,
            # the tiny model's own prompts (it answers them well); the format is asked of
            # every prompt by the verifier's `when: always`
            "prompts": {"dataset": "plain", "split": "train"},
            "sampling": {"k": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 48},
            "engine": ENGINE,
            "verify": {
                "verifiers": ["math", "answer_format"],
                "options": {"answer_format": {"when": "always"}},
            },
            "format": {"remedy": "restate", "min_compliance": 0.5},
            "select": {"cap": 2, "decontaminate": {"exact": True}},
            "train": full_training(learning_rate=0.003, max_steps=60, batch_size=16, max_len=96),
            # held out in the context it trained in: the tiny model does not carry a format
            # learnt without the system message over to prompts that have one
            "eval": {
                "prompts": {"dataset": "plain", "split": "eval", "limit": 30},
                "n": 4,
                "ks": [1, 4],
                "temperature": 0.5,
            },  # fmt: skip
        }
    )
    summary = run_bootstrap(cfg, lake.root, progress=False)
    rnd = summary["rounds"][0]
    assert rnd["restated"] is True  # the base model answers in the format 0 % of the time
    evals = lake.query(
        """SELECT e.round, e.metric, e.value FROM evals e JOIN runs r USING (run_id)
           WHERE e.task = 'all' AND r.flow = 'evaluate'
           AND json_extract_string(r.config, '$.name') = 'restate'"""
    )
    fmt = {r["round"]: r["value"] for r in evals.filter(pl.col("metric") == "format").to_dicts()}
    # the format share is the answer_format verdicts' pass rate over the eval's candidates
    assert fmt[0] == 0.0
    assert fmt[1] > fmt[0]
    metrics = {(r["round"], r["metric"]): r["value"] for r in evals.to_dicts()}
    for model in (0, 1):  # the protocol never passes more than the lenient reading
        assert metrics[(model, "pass@1")] <= metrics[(model, "pass@1 lenient")] + 1e-9
    # the report's prior table and the evaluation's own metrics, two readings of one count
    from thresher.evaluators.report import prior_by_task

    prior = prior_by_task(lake, "restate").filter(pl.col("task") == "all").row(0, named=True)
    assert prior["constant_answer"] == pytest.approx(metrics[(0, "constant-answer")])
    assert prior["base"] == pytest.approx(metrics[(0, "pass@1")])
    assert prior["non_modal_after"] == pytest.approx(metrics[(1, "pass@1 non-modal")])
    assert prior["ca_low"] <= prior["constant_answer"] <= prior["ca_high"]
    trained = lake.query("SELECT summary FROM runs WHERE flow = 'train' AND status = 'completed'")
    assert json.loads(trained["summary"][0])["restated"] > 0


def test_chunked_sampling_stops_a_prompt_once_selection_has_what_it_keeps(lake, tiny_model):
    chunk, k, cap, top = 2, 8, 2, 0.99
    summary = _curate(
        lake,
        tiny_model,
        "plain",
        sampling={"k": k, "chunk": chunk, "max_tokens": 24, "temperature": 1.0, "top_p": 1.0},
        verify={"verifiers": ["math"]},
        select={"cap": cap, "max_pass_rate": top, "decontaminate": {"exact": True}},
    )
    rows = lake.query(
        """SELECT c.prompt_id, c.sample_idx, c.text, s.drop_reason IS DISTINCT FROM 'failed'
                  AS passed
           FROM selections s JOIN candidates c USING (candidate_id)
           WHERE s.selection_id = ? ORDER BY c.prompt_id, c.sample_idx""",
        [summary["selection_id"]],
    )
    stopped = early = 0
    for _, group in rows.group_by(["prompt_id"], maintain_order=True):
        n = group.height
        assert n % chunk == 0 and n <= k and group["sample_idx"].to_list() == list(range(n))
        # before its last chunk no rule had stopped it; where it stopped early, one held
        if n > chunk:
            assert _stop_rule(group.head(n - chunk), cap, k, top) is None
        if n < k:
            early += 1
            why = _stop_rule(group, cap, k, top)
            assert why == "cap"  # at 0.99 of 8, too easy is known only at the 8th pass
        stopped += 1
    assert early > 0  # the tiny model solves many of these: they stop early
    assert summary["candidates"] == rows.height < stopped * k


def _passing_texts(group: pl.DataFrame) -> set[str]:
    return {" ".join(t.split()) for t in group.filter(pl.col("passed"))["text"].to_list()}


def _stop_rule(group: pl.DataFrame, cap: int, k: int, top: float) -> str | None:
    """By hand: more than `top` of k passed already; or cap distinct passing texts and
    failures enough that the rest cannot pass more than `top` of k."""
    passed = int(group["passed"].sum())
    if passed > top * k:
        return "too_easy"
    if len(_passing_texts(group)) >= cap and k - (group.height - passed) <= top * k:
        return "cap"
    return None


# the tiny model solves a few of the easiest questions of each (about 5 %) and none at
# two digits; letter_counting starts one level up, the others at their easiest
ENV_LEVELS = {
    "chain_sum": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    ],
    "basic_arithmetic": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    ],
    "letter_counting": [
        {"min_words": 1, "max_words": 2},
        {"min_words": 2, "max_words": 3},
        {"min_words": 3, "max_words": 5},
    ],
}
START = {"chain_sum": 0, "basic_arithmetic": 0, "letter_counting": 1}


def test_an_environment_round_moves_each_level_by_its_hand_counted_pass_rate(tiny_model, tmp_path):
    """A bootstrap round on reasoning-gym prompts generated at each task's start level: the
    next round's levels follow the pass rates counted by hand from the round's verdicts,
    and no generated prompt is a held-out one (the held-out set shares the round's seed)."""
    from thresher.config.env import round_dataset
    from thresher.ingest.envs import EnvSpec, TaskSpec, generate_round, ingest_env, round_levels
    from thresher.stores.queries import task_level_rates

    # a lake of its own: the tiny model's answers quote the arithmetic eval questions of
    # the module's lake, and decontamination would drop them
    lake = Lake(tmp_path / "lake")

    env = {
        "per_round": 16,
        "seed": 7,
        "curriculum": {"low": 0.15, "high": 0.6},
        "tasks": {t: {"start": START[t], "levels": levels} for t, levels in ENV_LEVELS.items()},
    }
    held = EnvSpec(tasks={"chain_sum": TaskSpec(config=ENV_LEVELS["chain_sum"][0])}, size=6, seed=7)
    ingest_env(lake, "reasoning-gym", held, "env-held", split="eval")
    cfg = BootstrapConfig.model_validate(
        {
            "name": "env",
            "base_model": str(tiny_model),
            "batch_size": 64,
            "max_rounds": 1,
            "min_gain": -1.0,
            "prompts": {"dataset": "env"},
            "environment": env,
            "sampling": {"k": 6, "temperature": 1.0, "top_p": 1.0, "max_tokens": 24},
            "engine": ENGINE,
            "verify": {"verifiers": ["math"]},
            # every passing answer trains: the tiny model solves about 5 % of these
            "select": {
                "cap": 6,
                "near_dup": False,
                "keep_truncated": True,
                "decontaminate": {"exact": True},
            },
            "train": full_training(max_steps=2, batch_size=8, max_len=224),
            "eval": {"prompts": {"dataset": "env-held", "split": "eval"}, "n": 1, "ks": [1]},
        }
    )
    run_bootstrap(cfg, lake.root, progress=False)
    first = round_dataset("env", 0)
    made = lake.query("SELECT task, prompt, meta FROM prompts WHERE dataset = ?", [first])
    assert made.group_by("task").len().sort("task").rows() == sorted((t, 16) for t in ENV_LEVELS)
    assert all(
        json.loads(m)["level"] == START[t] for t, m in zip(made["task"], made["meta"], strict=True)
    )
    held_out = set(lake.query("SELECT prompt FROM prompts WHERE split = 'eval'")["prompt"])
    assert not held_out & set(made["prompt"])
    before = lake.count("prompts")
    plans = generate_round(lake, cfg.environment, "env", "env", 0)  # again: nothing new
    assert lake.count("prompts") == before
    assert plans["chain_sum"]["held_out_clashes"] >= 6  # the held-out questions came up

    counted = lake.query(
        """SELECT p.task, count(*) FILTER (WHERE v.passed) AS passed, count(*) AS n
           FROM candidates c JOIN prompts p USING (prompt_id)
           JOIN verdicts v ON v.candidate_id = c.candidate_id AND v.verifier = 'math'
           WHERE p.dataset = ? GROUP BY 1""",
        [first],
    )
    rates = {r["task"]: r["passed"] / r["n"] for r in counted.to_dicts()}
    assert set(rates) == set(ENV_LEVELS) and all(n == 16 * 6 for n in counted["n"].to_list())

    def expected(task: str, rate: float, low: float, high: float) -> int:
        top, start = len(ENV_LEVELS[task]) - 1, START[task]
        return min(start + 1, top) if rate > high else max(start - 1, 0) if rate < low else start

    second = generate_round(lake, cfg.environment, "env", "env", 1)
    for task, rate in rates.items():
        assert second[task]["level"] == expected(task, rate, 0.15, 0.6), (task, rate, second[task])
    levels = lake.query(
        "SELECT DISTINCT task, json_extract(meta, '$.level')::INT AS level FROM prompts "
        "WHERE dataset = ?",
        [round_dataset("env", 1)],
    )
    assert dict(levels.rows()) == {t: p["level"] for t, p in second.items()}
    # the same round under bands either side of the most solved task's rate: one level
    # harder above the band, one easier below it
    task, rate = max(rates.items(), key=lambda kv: kv[1])
    assert rate > 0
    for (low, high), word in (((0.0, rate / 2), "harder"), ((rate + 0.01, 1.0), "easi")):
        band = cfg.environment.curriculum.model_copy(update={"low": low, "high": high})
        moved = cfg.environment.model_copy(update={"curriculum": band})
        plan = round_levels(lake, moved, "env", 1, task_level_rates(lake, "env", 0))[task]
        assert plan["level"] == expected(task, rate, low, high) and word in plan["why"], plan
