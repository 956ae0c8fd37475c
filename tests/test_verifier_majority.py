"""The `majority` verifier (pseudo-labels from agreement), its path through the curate
flow's verify step, and how often its labels are right (`majority_accuracy`)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from thresher.config import CurateConfig, SelectConfig
from thresher.evaluators.pseudo_labels import majority_accuracy
from thresher.flows.tasks import verify_task
from thresher.identities import verifier_digests
from thresher.intervals import wilson_interval
from thresher.plan import Batch, RoundPlan
from thresher.selection.select import select_batch
from thresher.stores.tables import write_candidates, write_verdicts
from thresher.verifiers import get_verifier, traits
from thresher.verifiers.majority import Majority
from thresher.verifiers.math_answer import MathAnswer

# prompt -> (texts, indices of hinted candidates)
FIXTURE = {
    "clear": (
        [
            "The answer is 20.",
            "#### 20.0",
            "The answer is 20",
            "The answer is 21",
            "I am not sure.",
            r"So \boxed{20}",
        ],
        (),
    ),
    "tie": (["The answer is 1", "The answer is 1", "The answer is 2", "The answer is 2"], ()),
    "weak": ([f"The answer is {a}" for a in (7, 7, 8, 9, 10)], ()),  # 2 of 5 < 0.5
    "lonely": (["The answer is 4", "Hmm."], ()),  # 1 vote < min_votes 2
    "half": (
        [
            r"So the answer is $\frac{1}{2}$.",
            "The answer is 0.5",
            r"\boxed{1/2}",
            "The answer is 3",
        ],
        (),
    ),
    "hinted": (["The answer is 5", "The answer is 5", "The answer is 6"], (2,)),
    "hedge": ([r"\boxed{3} or \boxed{4}", "The answer is 4", "#### 4", "The answer is 4"], ()),
}


def fixture_batch(order=None) -> pl.DataFrame:
    rows = [
        {
            "candidate_id": f"{p}-{i}",
            "prompt_id": p,
            "text": text,
            "hinted": i in hinted,
            "answer": "999",  # a wrong reference: majority never reads it
        }
        for p, (texts, hinted) in FIXTURE.items()
        for i, text in enumerate(texts)
    ]
    return pl.DataFrame(rows if order is None else order(rows))


def verdicts_of(frame: pl.DataFrame) -> dict[str, dict]:
    return {r["candidate_id"]: r for r in frame.iter_rows(named=True)}


def test_pass_set_equals_a_hand_count():
    got = verdicts_of(Majority().run(fixture_batch()))
    passed = {c for c, r in got.items() if r["passed"]}
    assert passed == {
        "clear-0", "clear-1", "clear-2", "clear-5",  # 20 (and 20.0): 4 of 6
        "half-0", "half-1", "half-2",  # 1/2 = 0.5 = \frac{1}{2}: 3 of 4
        "hinted-0", "hinted-1",  # 2 of the 2 unhinted
        "hedge-1", "hedge-2", "hedge-3",  # 3 of 4; the hedge does not vote
    }  # fmt: skip
    assert got["clear-0"]["reason"] == "pseudo-label '20': 4 of 6 answers agree; this answer agrees"
    assert got["clear-3"]["reason"] == (
        "pseudo-label '20': 4 of 6 answers agree; this answer '21' disagrees"
    )
    assert got["clear-4"]["reason"] == "no final answer found"
    assert got["tie-0"]["reason"] == "no pseudo-label: tie between '1' and '2' with 2 of 4 each"
    assert got["weak-0"]["reason"] == "no pseudo-label: top answer '7' has 2 of 5 (< 0.5)"
    assert got["lonely-0"]["reason"] == "no pseudo-label: top answer '4' has 1 of 2 (< 2 votes)"
    assert "does not judge hinted" in got["hinted-2"]["reason"]
    assert got["hinted-0"]["reason"].startswith("pseudo-label '5': 2 of 2 answers agree")
    assert got["hedge-0"]["reason"].startswith("hedged: 2 different final answers")
    assert got["half-3"]["reason"].endswith("this answer '3' disagrees")
    # score: the share of the prompt's unhinted candidates that give this answer
    assert got["clear-0"]["score"] == pytest.approx(4 / 6)
    assert got["clear-3"]["score"] == pytest.approx(1 / 6)
    assert got["clear-4"]["score"] == 0.0 and got["hedge-0"]["score"] == 0.0
    assert got["tie-2"]["score"] == 0.5 and got["hinted-2"]["score"] == 0.0


def test_row_order_does_not_change_a_verdict():
    forward = verdicts_of(Majority().run(fixture_batch()))
    backward = verdicts_of(Majority().run(fixture_batch(lambda rows: rows[::-1])))
    assert {c: r["passed"] for c, r in forward.items()} == {
        c: r["passed"] for c, r in backward.items()
    }


def test_options_change_the_vote():
    # "exact" compares normalised strings: 1/2, 0.5 and \frac{1}{2} are three answers
    exact = verdicts_of(Majority(compare="exact").run(fixture_batch()))
    assert not any(exact[f"half-{i}"]["passed"] for i in range(4))
    assert exact["clear-1"]["passed"]  # 20.0 normalises to 20
    loose = verdicts_of(Majority(min_agreement=0.4, min_votes=1).run(fixture_batch()))
    assert loose["weak-0"]["passed"] and not loose["weak-2"]["passed"]
    assert loose["lonely-0"]["passed"]
    strict = verdicts_of(Majority(min_agreement=0.75).run(fixture_batch()))
    assert strict["half-0"]["passed"] and not strict["clear-0"]["passed"]  # 3/4 vs 4/6


@pytest.mark.parametrize(
    "options, message",
    [
        ({"min_agreement": 0}, "min_agreement"),
        ({"min_agreement": 1.5}, "min_agreement"),
        ({"min_agreement": "half"}, "min_agreement"),
        ({"min_votes": 0}, "min_votes"),
        ({"min_votes": 2.5}, "min_votes"),
        ({"compare": "sympy"}, "compare"),
        ({"threshold": 3}, "bad options"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        get_verifier("majority", options)


def test_needs_the_prompt_of_each_candidate():
    with pytest.raises(ValueError, match="prompt_id"):
        Majority().run(pl.DataFrame({"candidate_id": ["a"], "text": ["The answer is 1"]}))
    assert traits("majority")["groups"] and not traits("math")["groups"]


# -- the curate flow's verify step --------------------------------------------------------


def _prompts(lake, answers: dict[str, str | None]) -> None:
    lake.append(
        "prompts",
        [
            {"prompt_id": p, "dataset": "d", "split": "train", "task": "t", "prompt": f"q {p}"}
            | {"answer": a}
            for p, a in answers.items()
        ],
    )


def _candidates(lake, prompt_id: str, answers: list, start: int = 0, round_=0, hinted=()):
    rows = [
        {
            "candidate_id": f"{prompt_id}-r{round_}-{start + i}",
            "prompt_id": prompt_id,
            "run_id": "run",
            "round": round_,
            "model": "m",
            "sample_idx": start + i,
            "text": "No idea." if a is None else f"The answer is {a}",
            "hinted": start + i in hinted,
        }
        for i, a in enumerate(answers)
    ]
    write_candidates(lake, rows)
    return [r["candidate_id"] for r in rows]


def _majority(lake, cfg: CurateConfig | None = None) -> dict[str, dict]:
    """The majority verdicts (those `cfg`'s run reads, or all)."""
    where = ""
    if cfg is not None:
        where = f"AND options_digest = '{verifier_digests(cfg)['majority']}'"
    rows = lake.query(f"SELECT * FROM verdicts WHERE verifier = 'majority' {where}")
    return verdicts_of(rows)


def _config(k: int) -> CurateConfig:
    return CurateConfig(
        name="x",
        model="m",
        prompts={"dataset": "d"},
        sampling={"k": k},
        verify={"verifiers": ["majority"]},
    )


def _plan(cfg, run_id: str):
    from dataclasses import replace

    from thresher.plan import plan_curate

    return replace(plan_curate(cfg), run_id=run_id)


def _verify(lake, cfg, run_id: str, ids: list[str]) -> int:
    """The verify task on these candidates, under a plan of `cfg` with this run id."""
    return verify_task.fn(str(lake.root), _plan(cfg, run_id), cfg.verify, Batch(candidate_ids=ids))


def test_a_larger_k_judges_every_candidate_again_among_all(lake):
    k4, k8 = _config(4), _config(8)
    _prompts(lake, {"p": "20", "q": "3"})
    first = _candidates(lake, "p", [21, 21, 20, 7]) + _candidates(lake, "q", [3, 3])
    assert _verify(lake, k4, "run-1", first) == 6
    assert _verify(lake, k4, "run-1b", first) == 0  # nothing missing
    before = _majority(lake, k4)
    # 21: 2 of 4
    assert {c for c, r in before.items() if r["passed"]} == {
        "p-r0-0", "p-r0-1", "q-r0-0", "q-r0-1"
    }  # fmt: skip
    # k raised from 4 to 8: 20 now has 4 of 8 votes, 21 three
    new = _candidates(lake, "p", [20, 20, 20, 21], start=4)
    assert _verify(lake, k8, "run-2", first + new) == 10  # q's too
    after = _majority(lake, k8)
    passed = {c: after[c]["passed"] for c in first + new}
    # the old 21s passed with k 4: now they fail like the new one
    assert passed == {
        "p-r0-0": False, "p-r0-1": False, "p-r0-2": True, "p-r0-3": False,
        "p-r0-4": True, "p-r0-5": True, "p-r0-6": True, "p-r0-7": False,
        "q-r0-0": True, "q-r0-1": True,
    }  # fmt: skip
    assert after["p-r0-0"]["reason"].startswith("pseudo-label '20': 4 of 8 answers agree")
    assert {after[c]["run_id"] for c in first + new} == {"run-2"}
    # what k 4 read stays as it was: going back to it reads its own verdicts
    assert _majority(lake, k4) == before
    assert _verify(lake, k4, "run-3", first) == 0
    assert lake.count("verdicts") == 16
    # a hinted candidate (verified in a second call with the batch's plain ones) fails
    hinted = _candidates(lake, "q", [3], start=2, hinted=(2,))
    assert _verify(lake, k8, "run-4", first + new + hinted) == 1
    assert "does not judge hinted" in _majority(lake, k8)["q-r0-2"]["reason"]
    assert _majority(lake, k8)["q-r0-0"]["run_id"] == "run-2"  # q's others kept theirs


def test_only_grouping_verifiers_carry_k_in_their_digest():
    both = {"verifiers": ["math", "majority"]}
    a = CurateConfig.model_validate({**_config(4).model_dump(), "verify": both})
    b = CurateConfig.model_validate({**_config(8).model_dump(), "verify": both})
    assert verifier_digests(a)["math"] == verifier_digests(b)["math"]
    assert verifier_digests(a)["majority"] != verifier_digests(b)["majority"]
    hard = CurateConfig.model_validate(
        {**a.model_dump(), "difficulty": {"hard_below": 0.2, "hard_k": 16}}
    )
    assert verifier_digests(hard)["majority"] != verifier_digests(a)["majority"]
    assert verifier_digests(hard)["math"] == verifier_digests(a)["math"]


# -- majority_accuracy ---------------------------------------------------------------------

# round -> prompt -> answers of its candidates (None: no answer); h5 is a hinted 5
ROUNDS = {
    0: {
        "p1": [20, 20, 20, 21],  # reference 20: majority right
        "p2": [6, 6, 6, 5, "h5"],  # reference 5: majority wrong
        "p3": [9, 9, 8, 9],  # no reference: pseudo-labelled
        "p4": [1, 2, 3, 4],  # reference 3: no majority
    },
    1: {"p1": [20, 20, 20, 20], "p3": [9, 9, 9, None]},
}
REFERENCES = {"p1": "20", "p2": "5", "p3": None, "p4": "3"}


def _judged_lake(lake) -> dict[int, list[str]]:
    """The ROUNDS candidates with real majority and math verdicts; ids per round."""
    _prompts(lake, REFERENCES)
    ids: dict[int, list[str]] = {}
    for round_, prompts in ROUNDS.items():
        for p, answers in prompts.items():
            hinted = {i for i, a in enumerate(answers) if a == "h5"}
            texts = [5 if a == "h5" else a for a in answers]
            ids.setdefault(round_, []).extend(
                _candidates(lake, p, texts, round_=round_, hinted=hinted)
            )
    batch = lake.query(
        """SELECT c.candidate_id, c.prompt_id, c.text, c.hinted, p.answer
           FROM candidates c JOIN prompts p USING (prompt_id) ORDER BY c.candidate_id"""
    )
    write_verdicts(lake, Majority().run(batch), "maj", "run")
    write_verdicts(lake, MathAnswer().run(batch), "math", "run")
    return ids


def test_majority_accuracy_by_candidate_round(lake):
    _judged_lake(lake)
    got = majority_accuracy(lake)
    assert got.select(
        "round", "prompts_with_majority", "pseudo_labelled", "checked", "majority_right"
    ).rows() == [(0, 3, 1, 2, 1), (1, 2, 1, 1, 1)]
    assert got["majority_right_rate"].to_list() == [0.5, 1.0]
    assert (got["low"][0], got["high"][0]) == pytest.approx(wilson_interval(1, 2))
    assert got["high"][1] == 1.0 and 0 < got["low"][1] < 1


def test_majority_accuracy_of_a_pipelines_selection(lake):
    ids = _judged_lake(lake)
    # pipeline "pipe" curated round 0's p1 and p2 only
    chosen = [c for c in ids[0] if c.startswith(("p1-", "p2-"))]
    select_batch(
        lake,
        RoundPlan(run_id="run", selection_id="sel", round=0, rule=None, verifiers=()),
        SelectConfig(near_dup=False),
        chosen,
    )
    lake.append(
        "runs",
        [
            {
                "run_id": "run",
                "flow": "curate",
                "round": 0,
                "model": "m",
                "config": '{"name": "pipe"}',
                "status": "completed",
                "selection_id": "sel",
            }
        ],
    )
    got = majority_accuracy(lake, "pipe")
    assert got.select(
        "round", "prompts_with_majority", "pseudo_labelled", "checked", "majority_right"
    ).rows() == [(0, 2, 0, 2, 1)]
    assert majority_accuracy(lake, "nobody").height == 0
    with pytest.raises(ValueError, match="another verifier"):
        majority_accuracy(lake, against="majority")


def test_majority_accuracy_needs_a_check_for_a_rate(lake):
    _judged_lake(lake)
    got = majority_accuracy(lake, against="exact")  # no exact verdicts: nothing checked
    assert got["checked"].to_list() == [0, 0]
    assert got["majority_right_rate"].to_list() == [None, None]
    assert got["low"].to_list() == [0.0, 0.0] and got["high"].to_list() == [1.0, 1.0]


def test_wilson_interval():
    low, high = wilson_interval(81, 100)
    assert (round(low, 4), round(high, 4)) == (0.7222, 0.8749)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    wide, narrow = wilson_interval(5, 10), wilson_interval(500, 1000)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]
    (low3, high3), (low7, high7) = wilson_interval(3, 10), wilson_interval(7, 10)
    assert math.isclose(low3, 1 - high7) and math.isclose(high3, 1 - low7)
    for bad in ((-1, 5), (6, 5), (1, -1)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)
