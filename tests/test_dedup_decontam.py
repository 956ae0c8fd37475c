"""Near-duplicates, cap policies, decontamination, the funnel and exports."""

import json
import random

import numpy as np
import pytest
from helpers import select

from thresher.selection.decontam import EvalIndex, file_items
from thresher.selection.minhash import jaccard, near_duplicates, shingles, signatures
from thresher.stores.export import ExportError, export_round

rng = random.Random(0)
VOCAB = [f"word{i}" for i in range(2000)]


def solution(n=200, var="total"):
    body = [rng.choice(VOCAB) for _ in range(n)]
    body[n // 10] = body[3 * n // 4] = var  # a variable used twice
    return body


def seed_prompt(lake, pid, texts, passed=None, prompt="Solve it.", run_id="r"):
    lake.append(
        "prompts",
        [{"prompt_id": pid, "dataset": "d", "split": "train", "task": "t", "prompt": prompt}],
    )
    lake.append(
        "candidates",
        [
            {
                "candidate_id": f"{pid}-{i}",
                "prompt_id": pid,
                "run_id": run_id,
                "round": 0,
                "model": "m",
                "sample_idx": i,
                "text": t,
                "n_tokens": len(t.split()),
            }
            for i, t in enumerate(texts)
        ],
    )
    passed = passed or [True] * len(texts)
    lake.append(
        "verdicts",
        [
            {"candidate_id": f"{pid}-{i}", "verifier": "math", "passed": p, "score": float(p)}
            for i, p in enumerate(passed)
        ],
    )


def test_signatures_equal_datasketch():
    from datasketch import MinHash

    texts = [" ".join(solution(50)) for _ in range(20)] + ["short text", ""]
    sigs = signatures(texts, num_perm=64, shingle_size=3)
    for text, sig in zip(texts, sigs, strict=True):
        m = MinHash(num_perm=64)
        for s in shingles(text, 3):
            m.update(s.encode())
        assert (np.asarray(m.hashvalues, dtype=np.uint32) == sig).all()


def test_renamed_and_reworded_collapse_different_solutions_stay(lake):
    base = solution()
    renamed = list(base)
    renamed[20] = renamed[150] = "sum_so_far"  # the variable, renamed
    reworded = list(base)
    reworded[80:83] = ["so", "we", "get"]
    other = solution()
    texts = [" ".join(t) for t in (base, renamed, reworded, other)]
    seed_prompt(lake, "p", texts)
    select(lake, ["p"], cap=10)
    rows = dict(lake.query("SELECT candidate_id, drop_reason FROM selections").rows())
    assert rows == {"p-0": None, "p-1": "duplicate_of:p-0", "p-2": "duplicate_of:p-0", "p-3": None}


def test_near_duplicates_only_within_a_prompt_unless_asked():
    text = " ".join(solution())
    sigs = signatures([text, text])
    assert near_duplicates(sigs, ["a", "b"]) == [None, None]
    assert near_duplicates(sigs, ["a", "a"]) == [None, 0]


@pytest.mark.parametrize("policy", ["diverse", "shortest", "top_score", "random", "first"])
@pytest.mark.parametrize("cap", [1, 2, 5])
def test_cap_holds_for_every_prompt_and_policy(lake, policy, cap):
    for p in range(4):
        seed_prompt(lake, f"p{p}", [" ".join(solution(30 + 5 * i)) for i in range(7)])
    select(lake, [f"p{p}" for p in range(4)], cap=cap, policy=policy)
    kept = lake.query(
        "SELECT prompt_id, count(*) FILTER (WHERE kept) AS k FROM selections GROUP BY 1"
    )
    assert kept["k"].to_list() == [cap] * 4


def test_policies_choose_what_they_promise(lake):
    texts = [" ".join(solution(n)) for n in (80, 20, 50, 40)]
    seed_prompt(lake, "p", texts)
    lake.append(
        "verdicts",
        [
            {"candidate_id": f"p-{i}", "verifier": "reward", "passed": True, "score": s}
            for i, s in enumerate([0.1, 0.2, 0.9, 0.5])
        ],
    )
    select(lake, ["p"], cap=1, policy="shortest", rule="math")
    assert lake.query("SELECT candidate_id FROM selections WHERE kept")["candidate_id"][0] == "p-1"


def test_top_score_uses_the_reward(tmp_path):
    from thresher.stores.lake import Lake

    lake = Lake(tmp_path / "l")
    seed_prompt(lake, "p", [" ".join(solution(n)) for n in (80, 20, 50, 40)])
    lake.append(
        "verdicts",
        [
            {"candidate_id": f"p-{i}", "verifier": "reward", "passed": True, "score": s}
            for i, s in enumerate([0.1, 0.2, 0.9, 0.5])
        ],
    )
    select(lake, ["p"], cap=2, policy="top_score", rule="math")
    kept = lake.query("SELECT candidate_id FROM selections WHERE kept ORDER BY 1")
    assert kept["candidate_id"].to_list() == ["p-2", "p-3"]


def test_hinted_candidates_rank_after_unhinted(lake):
    seed_prompt(lake, "p", ["unused"])
    lake.append(
        "candidates",
        [
            {
                "candidate_id": "h",
                "prompt_id": "p",
                "run_id": "r",
                "round": 0,
                "sample_idx": 9,
                "text": " ".join(solution(10)),
                "hinted": True,
                "n_tokens": 1,
            },
        ],
    )
    lake.append("verdicts", [{"candidate_id": "h", "verifier": "math", "passed": True}])
    select(lake, ["p"], cap=1, policy="shortest")
    assert lake.query("SELECT candidate_id FROM selections WHERE kept")["candidate_id"][0] == "p-0"


def mean_similarity(lake, sigs_by_id):
    kept = lake.query("SELECT candidate_id FROM selections WHERE kept")["candidate_id"].to_list()
    pairs = [(a, b) for i, a in enumerate(kept) for b in kept[i + 1 :]]
    return float(np.mean([jaccard(sigs_by_id[a], sigs_by_id[b]) for a, b in pairs]))


def test_diverse_keeps_a_more_diverse_set_than_random(tmp_path):
    from thresher.stores.lake import Lake

    base = solution(200)
    variants = []
    for _ in range(6):  # variants of one solution: similar, but below the near-dup threshold
        v = list(base)
        for _ in range(12):
            v[rng.randrange(200)] = rng.choice(VOCAB)
        variants.append(" ".join(v))
    distinct = [" ".join(solution(200)) for _ in range(2)]
    texts = variants + distinct
    sigs = dict(zip([f"p-{i}" for i in range(len(texts))], signatures(texts), strict=True))

    def kept_similarity(policy, seed=0):
        lake = Lake(tmp_path / f"{policy}-{seed}")
        seed_prompt(lake, "p", texts)
        select(lake, ["p"], cap=3, policy=policy, seed=seed)
        assert lake.query("SELECT count(*) AS n FROM selections WHERE kept")["n"][0] == 3
        return mean_similarity(lake, sigs)

    diverse = kept_similarity("diverse")
    randoms = [kept_similarity("random", seed) for seed in range(8)]
    assert diverse < float(np.mean(randoms))
    assert diverse <= min(randoms)


def test_too_easy_prompts_are_dropped(lake):
    seed_prompt(lake, "easy", ["a b c d e f", "g h i j k l"], passed=[True, True])
    seed_prompt(lake, "hard", ["m n o p q r", "s t u v w x"], passed=[True, False])
    select(lake, ["easy", "hard"], cap=4, max_pass_rate=0.75)
    rows = dict(lake.query("SELECT candidate_id, drop_reason FROM selections").rows())
    assert rows["easy-0"] == rows["easy-1"] == "too_easy"
    assert rows["hard-0"] is None and rows["hard-1"] == "failed"


def test_planted_eval_item_is_caught(lake, tmp_path):
    eval_prompt = (
        "A train leaves the station at nine and travels at sixty miles per hour "
        "for three hours before it stops; how far did it go?"
    )
    index = EvalIndex(n=13).add([("eval-1", eval_prompt), ("eval-2", "What is 6 * 5?")])
    seed_prompt(lake, "copy", ["The answer is 180."], prompt=eval_prompt.upper())
    seed_prompt(
        lake,
        "leak",
        [f"Recall: {eval_prompt} It went 180 miles.", "It is 180."],
        prompt="Another question entirely?",
    )
    seed_prompt(lake, "short", ["30"], prompt="What is 6 * 5 ?")  # spacing hides nothing
    seed_prompt(lake, "near", ["11"], prompt="What is 6 + 5?")  # a different question
    select(
        lake,
        ["copy", "leak", "short", "near"],
        cap=4,
        eval_index=index,
    )
    rows = dict(lake.query("SELECT candidate_id, drop_reason FROM selections").rows())
    assert rows["copy-0"] == "contaminated:eval-1"
    assert rows["leak-0"] == "contaminated:eval-1" and rows["leak-1"] is None
    assert rows["short-0"] == "contaminated:eval-2"
    assert rows["near-0"] is None

    extra = tmp_path / "bench.jsonl"
    extra.write_text(json.dumps({"question": "Another question entirely?"}) + "\n")
    assert EvalIndex(n=13).add(file_items(extra)).match(["another QUESTION entirely ?"]) == [
        "bench.jsonl:1"
    ]


def test_exact_decontamination_ignores_a_shared_template():
    template = (
        "State the final answer to the following arithmetic problem: {} =\n\n"
        "Give only the final answer between <answer> and </answer> tags."
    )
    items = [("e1", template.format("4 + 3 - 2")), ("e2", template.format("9 - 1"))]
    train = [template.format("4 + 3"), template.format("9  -  1").upper(), "9 - 1"]
    # 13-grams that are mostly template flag a different question ...
    assert EvalIndex(n=13).add(items).match(train)[0] == "e1"
    # ... only the same question, whole, counts when matching exactly
    assert EvalIndex(n=None).add(items).match(train) == [None, "e2", None]


def test_a_round_that_kept_nothing_says_why(lake):
    from thresher.config import TrainConfig
    from thresher.flows.train import no_rows_message

    seed_prompt(lake, "leak", ["It is 11.", "11"], prompt="What is 6 + 5?")
    seed_prompt(lake, "hard", ["no", "no", "no"], passed=[False] * 3)
    select(lake, ["leak", "hard"], eval_index=EvalIndex(n=None).add([("e", "what is 6+5 ?")]))
    cfg = TrainConfig(name="t", base_model="m", data={"round": 0})
    assert no_rows_message(cfg, lake) == (
        "no training rows: round 0 kept nothing (3 failed, 2 contaminated; see the funnel view)"
    )


def test_minhash_decontamination_catches_near_copies():
    item = " ".join(solution(60))
    near = item.split()
    near[30] = "changed"
    index = EvalIndex(n=50, minhash_threshold=0.7).add([("e", item)])
    assert index.match([" ".join(near), " ".join(solution(60))]) == ["e", None]


def test_funnel_adds_up(lake):
    for p in range(5):
        base = " ".join(solution(60))
        seed_prompt(
            lake,
            f"p{p}",
            [base, base, " ".join(solution(60)), "wrong", base + " x"],
            passed=[True, True, True, False, True],
        )
    select(lake, [f"p{p}" for p in range(5)], cap=1)
    funnel = dict(lake.query("SELECT outcome, candidates FROM funnel").rows())
    assert sum(funnel.values()) == lake.count("candidates") == 25
    assert funnel["kept"] == 5 and funnel["failed"] == 5
    assert funnel["duplicate_of"] == 10 and funnel["capped"] == 5


def test_exports_load_with_datasets(lake, tmp_path):
    import datasets

    seed_prompt(
        lake, "p", ["right one", "right two", "wrong"], passed=[True, True, False], prompt="Q?"
    )
    select(lake, ["p"], cap=2, near_dup=False)
    n = export_round(lake, 0, "sft", tmp_path / "sft")
    sft = datasets.load_from_disk(str(tmp_path / "sft"))
    assert n == len(sft) == 2
    assert set(sft.column_names) >= {
        "messages",
        "prompt",
        "completion",
        "prompt_id",
        "candidate_id",
        "round",
        "hinted",
    }
    assert sft[0]["messages"] == [
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "right one"},
    ]
    assert len((tmp_path / "sft" / "data.jsonl").read_text().splitlines()) == 2

    export_round(lake, 0, "dpo", tmp_path / "dpo")
    dpo = datasets.load_from_disk(str(tmp_path / "dpo"))
    assert set(dpo.column_names) >= {"prompt", "chosen", "rejected"}
    assert {r["rejected"][0]["content"] for r in dpo} == {"wrong"}
    with pytest.raises(ExportError, match="no kept candidates"):
        export_round(lake, 7, "sft", tmp_path / "none")
