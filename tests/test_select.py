import pytest

from thresher.stores.select import select_batch


def seed_lake(lake, texts_by_prompt, passed_by_prompt, run_id="r", round_=0):
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
    written = select_batch(lake, "r", 0, ["p1", "p2"], cap=2)
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
    assert select_batch(lake, "r", 0, ["p1", "p2"], cap=2) == 0


@pytest.mark.parametrize("cap", [1, 3])
def test_cap_holds_for_every_prompt(lake, cap):
    texts = {f"p{i}": [f"t{j}" for j in range(5)] for i in range(4)}
    seed_lake(lake, texts, {p: [True] * 5 for p in texts})
    select_batch(lake, "r", 0, list(texts), cap=cap)
    per_prompt = lake.query(
        "SELECT prompt_id, count(*) FILTER (WHERE kept) AS k FROM selections GROUP BY 1"
    )
    assert per_prompt["k"].to_list() == [cap] * 4


def test_cap_must_be_positive(lake):
    with pytest.raises(ValueError, match="cap"):
        select_batch(lake, "r", 0, ["p"], cap=0)
