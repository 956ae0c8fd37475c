import polars as pl
import pytest

from thresher.verifiers import get_verifier
from thresher.verifiers.rules import Choice, Format, Regex


@pytest.mark.parametrize(
    "text, passed",
    [
        (r"The answer is \boxed{B}", True),
        ("The answer is (B).", True),
        ("<answer>b</answer>", True),
        ("The answer is (C).", False),
        (r"\boxed{B or C}", False),  # hedge
        ("I think it is 42", False),  # no letter
    ],
)
def test_choice(text, passed):
    assert Choice().check(text, "B").passed is passed


def test_regex():
    assert Regex().check(r"\boxed{2024-01-31}", r"\d{4}-\d{2}-\d{2}").passed
    assert not Regex().check(r"\boxed{31/01/2024}", r"\d{4}-\d{2}-\d{2}").passed
    assert Regex(whole=True, flags="i").check("YES", "yes").passed
    assert "not a valid regex" in Regex().check("x", "(").reason


def test_format_required_sections_in_order():
    f = Format(required=["<think>", "</think>", "<answer>", "</answer>"])
    assert f.check("<think>hmm</think><answer>4</answer>").passed
    assert "missing" in f.check("<think>hmm</think> 4").reason
    assert "out of order" in f.check("<answer>4</answer><think>x</think>").reason
    assert "appears 2 times" in f.check("<think></think><think></think><answer>4</answer>").reason


def test_format_json_schema():
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    f = Format(json_schema=schema, json_tag="answer")
    assert f.check('<answer>{"age": 3}</answer>').passed
    assert "JSON schema" in f.check('<answer>{"age": "3"}</answer>').reason
    assert "not JSON" in f.check("<answer>{age: 3}</answer>").reason
    assert "no <answer>" in f.check('{"age": 3}').reason
    assert Format(json_schema=schema).check('```json\n{"age": 1}\n```').passed


def test_format_and_correctness_are_separate_rows():
    batch = pl.DataFrame(
        {
            "candidate_id": ["a", "b"],
            "text": [r"<answer>\boxed{4}</answer>", r"\boxed{4}"],
            "answer": ["4", "4"],
            "prompt_id": ["p", "p"],
        }
    )
    required = {"required": ["<answer>", "</answer>"]}
    out = pl.concat([get_verifier("math").run(batch), get_verifier("format", required).run(batch)])
    got = {(r["candidate_id"], r["verifier"]): r["passed"] for r in out.iter_rows(named=True)}
    assert got == {
        ("a", "math"): True,
        ("b", "math"): True,
        ("a", "format"): True,
        ("b", "format"): False,
    }


def test_bad_options_are_a_clear_error():
    with pytest.raises(ValueError, match="bad options for verifier 'math'"):
        get_verifier("math", {"nope": 1})


def test_options_of_how_a_verifier_runs_are_not_part_of_its_verdicts_identity():
    from thresher.verifiers import options_digest

    judge = {"server": "http://judge:8000", "served_model": "j", "max_tokens": 8}
    same = [
        ("judge", judge, {**judge, "concurrency": 64, "timeout_s": 5, "retries": 0}),
        ("code", {"timeout_s": 10}, {"timeout_s": 10, "workers": 2}),
        ("reward", {"model": "rm"}, {"model": "rm", "batch_size": 64}),
    ]
    for name, a, b in same:
        assert options_digest(name, a) == options_digest(name, b), name
    different = [
        ("judge", judge, {**judge, "max_tokens": 16}),
        ("judge", judge, {**judge, "served_model": "other"}),
        ("code", {"timeout_s": 10}, {"timeout_s": 20}),
        ("reward", {"model": "rm"}, {"model": "rm", "max_length": 512}),
        ("math", None, {"timeout_s": 1}),  # a rule verifier has no operational options
    ]
    for name, a, b in different:
        assert options_digest(name, a) != options_digest(name, b), (name, b)
