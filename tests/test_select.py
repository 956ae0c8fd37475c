import pytest
from helpers import select


def seed_lake(lake, texts_by_prompt, passed_by_prompt, run_id="r", round_=0, cut=()):
    """Candidates `<prompt>-<i>` with one exact verdict each; those in `cut` were cut at
    max_tokens (finish_reason length)."""
    candidates, verdicts = [], []
    for pid, texts in texts_by_prompt.items():
        for i, text in enumerate(texts):
            cid = f"{pid}-{i}"
            candidates.append(
                {
                    "candidate_id": cid,
                    "prompt_id": pid,
                    "run_id": run_id,
                    "round": round_,
                    "model": "m",
                    "sample_idx": i,
                    "text": text,
                    "finish_reason": "length" if cid in cut else "stop",
                }
            )
            verdicts.append(
                {
                    "candidate_id": cid,
                    "verifier": "exact",
                    "score": 1.0,
                    "passed": passed_by_prompt[pid][i],
                    "reason": "",
                    "run_id": run_id,
                }
            )
    lake.append("candidates", candidates)
    lake.append("verdicts", verdicts)


def test_failed_duplicates_and_cap(lake):
    seed_lake(
        lake,
        {
            "p1": ["A", "A ", "B", "C", "D", "wrong"],  # "A " is A with other whitespace
            "p2": ["x", "x"],
        },
        {"p1": [True, True, True, True, True, False], "p2": [False, False]},
    )
    written = select(lake, ["p1", "p2"], cap=2, policy="first")
    assert written == 8
    rows = {r["candidate_id"]: r for r in lake.query("SELECT * FROM selections").to_dicts()}
    assert rows["p1-0"]["kept"] and rows["p1-2"]["kept"]
    assert rows["p1-1"]["drop_reason"] == "duplicate_of:p1-0"
    assert rows["p1-3"]["drop_reason"] == "capped" and rows["p1-4"]["drop_reason"] == "capped"
    assert rows["p1-5"]["drop_reason"] == "failed"
    assert all(rows[c]["drop_reason"] == "failed" for c in ("p2-0", "p2-1"))
    assert all(r["kept"] == (r["drop_reason"] is None) for r in rows.values())

    funnel = dict(lake.query("SELECT outcome, candidates FROM funnel").rows())
    assert funnel == {"kept": 2, "duplicate_of": 1, "capped": 2, "failed": 3}
    # selecting again writes nothing new
    assert select(lake, ["p1", "p2"], cap=2, policy="first") == 0


def test_a_passing_candidate_cut_at_max_tokens_is_not_kept(lake):
    seed_lake(
        lake,
        {"p1": ["A", "B", "C"], "p2": ["x", "y"]},
        {"p1": [True, True, False], "p2": [True, False]},
        cut={"p1-0", "p1-2", "p2-1"},
    )
    select(lake, ["p1", "p2"], cap=4, policy="first")
    rows = {r["candidate_id"]: r for r in lake.query("SELECT * FROM selections").to_dicts()}
    assert rows["p1-0"]["drop_reason"] == "truncated" and not rows["p1-0"]["kept"]
    assert rows["p1-1"]["kept"] and rows["p2-0"]["kept"]
    # a cut candidate that failed is a failure first
    assert rows["p1-2"]["drop_reason"] == "failed" == rows["p2-1"]["drop_reason"]
    funnel = lake.query("SELECT * FROM round_funnel").row(0, named=True)
    assert (funnel["passed"], funnel["truncated_dropped"], funnel["kept"]) == (3, 1, 2)
    outcomes = dict(lake.query("SELECT outcome, candidates FROM funnel").rows())
    assert outcomes == {"kept": 2, "truncated": 1, "failed": 2}
    # the pass rate still counts it: it did pass
    assert lake.query("SELECT pass_rate FROM yield_by_round")["pass_rate"][0] == 0.6


def test_keep_truncated_keeps_them(lake):
    seed_lake(lake, {"p1": ["A", "B"]}, {"p1": [True, True]}, cut={"p1-0"})
    select(lake, ["p1"], cap=4, policy="first", keep_truncated=True)
    kept = lake.query("SELECT candidate_id FROM selections WHERE kept ORDER BY 1")
    assert kept["candidate_id"].to_list() == ["p1-0", "p1-1"]


@pytest.mark.parametrize("cap", [1, 3])
def test_cap_holds_for_every_prompt(lake, cap):
    texts = {f"p{i}": [f"t{j}" for j in range(5)] for i in range(4)}
    seed_lake(lake, texts, {p: [True] * 5 for p in texts})
    select(lake, list(texts), cap=cap)
    per_prompt = lake.query(
        "SELECT prompt_id, count(*) FILTER (WHERE kept) AS k FROM selections GROUP BY 1"
    )
    assert per_prompt["k"].to_list() == [cap] * 4


def test_cap_must_be_positive(lake):
    with pytest.raises(ValueError, match="cap"):
        select(lake, ["p"], cap=0)


@pytest.mark.parametrize(
    "rule, kept",
    [
        ("math and format", ["c0"]),
        ("math", ["c0", "c1"]),
        ("math or format", ["c0", "c1", "c2"]),
        ("math and not format", ["c1"]),
        (None, ["c0"]),
    ],
)
def test_rule_combines_verifiers(lake, rule, kept):
    lake.append(
        "candidates",
        [
            {
                "candidate_id": f"c{i}",
                "prompt_id": "p",
                "run_id": "r",
                "round": 0,
                "model": "m",
                "sample_idx": i,
                "text": f"t{i}",
            }
            for i in range(3)
        ],
    )
    # c0: right and well formatted; c1: right, badly formatted; c2: wrong, well formatted
    verdicts = [
        ("c0", "math", True),
        ("c0", "format", True),
        ("c1", "math", True),
        ("c1", "format", False),
        ("c2", "math", False),
        ("c2", "format", True),
    ]
    lake.append(
        "verdicts",
        [
            {"candidate_id": c, "verifier": v, "passed": p, "score": float(p)}
            for c, v, p in verdicts
        ],
    )
    select(lake, ["p"], cap=5, rule=rule)
    got = lake.query("SELECT candidate_id FROM selections WHERE kept ORDER BY 1")
    assert got["candidate_id"].to_list() == kept


def test_malformed_rules_are_refused():
    from thresher.rules import RuleError, rule_names

    assert rule_names("math and (format or not code)") == {"math", "format", "code"}
    for bad in ("math +", "__import__('os')", "math == 1", "math and"):
        with pytest.raises(RuleError):
            rule_names(bad)
