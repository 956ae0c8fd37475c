import polars as pl
import pytest

from thresher.verifiers import get_verifier, verify
from thresher.verifiers.math_answer import MathAnswer
from thresher.verifiers.rules import Choice, Format, Regex


@pytest.mark.parametrize(
    "text, reference",
    [
        (r"so \boxed{\frac{1}{2}}", "0.5"),  # fraction vs decimal
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{50\%}", "0.5"),
        (r"\boxed{\sqrt{4}}", "2"),
        (r"\boxed{x^2+2x+1}", "(x+1)^2"),
        (r"\boxed{5\text{ cm}}", "5"),  # units
        ("#### 1,234", "1234"),
        ("The answer is $12.", "12"),  # money sign
        ("<answer>7</answer>", "7"),
        (r"first \boxed{2}, so again \boxed{2}", "2"),  # repeating one answer is no hedge
    ],
)
def test_math_equivalent_forms_pass(text, reference):
    verdict = MathAnswer().judge(text, reference)
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize(
    "text, reference, reason",
    [
        (r"\boxed{3}", "2", "is not"),
        (r"\boxed{2} or maybe \boxed{3}", "2", "hedged"),
        ("The answer is 2, 3, 4", "2", "hedged"),
        ("The answer is 2 or 3", "2", "hedged"),
        ("I could not solve it.", "2", "no final answer"),
        (r"\boxed{2}", None, "no reference"),
    ],
)
def test_math_wrong_hedged_and_missing_fail_with_reason(text, reference, reason):
    verdict = MathAnswer().judge(text, reference)
    assert not verdict.passed and verdict.score == 0.0
    assert reason in verdict.reason


def test_math_custom_pattern():
    m = MathAnswer(pattern=r"FINAL: (\S+)")
    assert m.judge("work... FINAL: 42", "42").passed
    assert not m.judge("work... FINAL: 41", "42").passed


def test_math_pathological_input_does_not_hang():
    huge = r"\boxed{" + "(" * 400 + "1" + ")" * 400 + "^{" * 50 + "2" + "}" * 50 + "}"
    verdict = MathAnswer(timeout_s=2).judge(huge, "1")
    assert verdict.passed in (True, False)  # answered, within the timeout


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
    assert Choice().judge(text, "B").passed is passed


def test_regex():
    assert Regex().judge(r"\boxed{2024-01-31}", r"\d{4}-\d{2}-\d{2}").passed
    assert not Regex().judge(r"\boxed{31/01/2024}", r"\d{4}-\d{2}-\d{2}").passed
    assert Regex(whole=True, flags="i").judge("YES", "yes").passed
    assert "not a valid regex" in Regex().judge("x", "(").reason


def test_format_required_sections_in_order():
    f = Format(required=["<think>", "</think>", "<answer>", "</answer>"])
    assert f.judge("<think>hmm</think><answer>4</answer>").passed
    assert "missing" in f.judge("<think>hmm</think> 4").reason
    assert "out of order" in f.judge("<answer>4</answer><think>x</think>").reason
    assert "appears 2 times" in f.judge("<think></think><think></think><answer>4</answer>").reason


def test_format_json_schema():
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    f = Format(json_schema=schema, json_tag="answer")
    assert f.judge('<answer>{"age": 3}</answer>').passed
    assert "JSON schema" in f.judge('<answer>{"age": "3"}</answer>').reason
    assert "not JSON" in f.judge("<answer>{age: 3}</answer>").reason
    assert "no <answer>" in f.judge('{"age": 3}').reason
    assert Format(json_schema=schema).judge('```json\n{"age": 1}\n```').passed


def test_format_and_correctness_are_separate_rows():
    batch = pl.DataFrame(
        {
            "candidate_id": ["a", "b"],
            "text": [r"<answer>\boxed{4}</answer>", r"\boxed{4}"],
            "answer": ["4", "4"],
            "prompt_id": ["p", "p"],
        }
    )
    out = verify(batch, ["math", "format"], {"format": {"required": ["<answer>", "</answer>"]}})
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
