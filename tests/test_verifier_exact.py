import polars as pl
import pytest
from helpers import VERDICT_COLUMNS

from thresher.verifiers import get_verifier
from thresher.verifiers.exact import check, extract_answer


@pytest.mark.parametrize(
    "text, answer, how",
    [
        (r"so the result is \boxed{\frac{1}{2}}.", r"\frac{1}{2}", "boxed"),
        ("work...\n#### 1,234", "1,234", "####"),
        ("<answer> 7 </answer>", "7", "<answer>"),
        (" 3 + 4 = 7. The answer is 7.", "7", "'answer is'"),
        ("I think 3 then 5", "5", "last number"),
        ("So, 0.81 is the final answer between 0.81 and 1.", "0.81", "'answer is'"),
        ("This is the answer: 4", "4", "'answer is'"),  # no value before the marker
        ("Thus 12 is my final answer. The answer is 13", "13", "'answer is'"),
        ("no idea", None, "nothing"),
    ],
)
def test_extraction(text, answer, how):
    assert extract_answer(text) == (answer, how)


@pytest.mark.parametrize(
    "text, reference, passed",
    [
        (" 6 * 5 = 30. The answer is 30.", "30", True),
        ("The answer is 30.0", "30", True),
        ("#### 1,234", "1234", True),
        ("The answer is $12$.", "12", True),
        ("The answer is 36.", "30", False),
        ("nothing here", "30", False),
        ("The answer is 30.", None, False),
    ],
)
def test_check(text, reference, passed):
    verdict = check(text, reference)
    assert verdict.passed is passed
    assert verdict.score == (1.0 if passed else 0.0)
    assert verdict.reason


def test_batch_interface_one_row_per_candidate():
    batch = pl.DataFrame(
        {"candidate_id": ["a", "b"], "text": ["answer is 2", "answer is 3"], "answer": ["2", "2"]}
    )
    out = get_verifier("exact").run(batch)
    assert out.columns == VERDICT_COLUMNS
    assert out["passed"].to_list() == [True, False]
    assert out["verifier"].to_list() == ["exact", "exact"]
    assert (out["elapsed_ms"] >= 0).all()


def test_unknown_verifier_names_the_known_ones():
    with pytest.raises(KeyError, match="known: .*exact"):
        get_verifier("nope")
