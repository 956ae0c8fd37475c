"""Candidate ids are the lake's keys: the fast path must give exactly the ids it always gave."""

from thresher.identities import candidate_id, candidate_ids, expected_ids
from thresher.ids import content_id

PARAMS = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 32, "stop": ["\n", "é"], "seed": 0}


def test_candidate_ids_equal_the_content_hash_of_their_parts():
    for prompt_id, model, round_ in [("abc", "/m/x", 0), ('é"q\\', "m+lora:/a b", 12)]:
        fast = candidate_ids(prompt_id, model, round_, range(10), {**PARAMS, "hint": "{x}"})
        slow = [
            content_id("candidate", prompt_id, model, round_, i, {**PARAMS, "hint": "{x}"})
            for i in range(10)
        ]
        assert fast == slow
        assert fast[3] == candidate_id(prompt_id, model, round_, 3, {**PARAMS, "hint": "{x}"})


def test_expected_ids_cover_k_indices_per_prompt_in_order():
    ids = expected_ids(["a", "b"], "m", 0, 3, PARAMS)
    assert ids == candidate_ids("a", "m", 0, range(3), PARAMS) + candidate_ids(
        "b", "m", 0, range(3), PARAMS
    )
    assert len(set(ids)) == 6
    assert candidate_ids("a", "m", 0, [4, 5], PARAMS) == expected_ids(["a"], "m", 0, 6, PARAMS)[4:]


def test_expected_ids_take_a_k_per_prompt():
    ids = expected_ids(["a", "b", "c"], "m", 1, {"a": 2, "b": 0, "c": 1}, PARAMS)
    assert ids == [content_id("candidate", "a", "m", 1, i, PARAMS) for i in range(2)] + [
        content_id("candidate", "c", "m", 1, 0, PARAMS)
    ]
