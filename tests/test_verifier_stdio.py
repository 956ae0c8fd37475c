"""stdin/stdout tests (the competitive-programming format): programs checked by their output."""

import json

import polars as pl
import pytest

from thresher.sandbox import Job, Limits, run_jobs
from thresher.verifiers.code import UnitTests

# The problem: the first line is n, the second n integers; print their sum.
TESTS = [
    {"input": "3\n1 2 3\n", "output": "6\n"},
    {"input": "1\n-5\n", "output": "-5"},
    {"input": "4\n10 20 30 40\n", "output": "100\n"},
]
LIMITS = Limits(timeout_s=6, test_timeout_s=1.5, cpu_s=3, memory_mb=512, output_mb=1)

SUM = "sum(map(int, input().split()))"  # reads the second line and sums it
SUMS = f"input()\nprint({SUM})\n"  # the plain right answer

# (program, the verdict it must get: "pass" or words its reason must contain)
PROGRAMS = {
    "input()": (SUMS, "pass"),
    "sys.stdin.read": (
        "import sys\nn, *xs = map(int, sys.stdin.read().split())\nprint(sum(xs[:n]))\n",
        "pass",
    ),
    "stdin.buffer": (
        "import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))\n",
        "pass",
    ),
    "open(0)": ("print(sum(map(int, open(0).read().split()[1:])))\n", "pass"),
    "line by line": (
        "import sys\nlines = [l for l in sys.stdin]\nprint(sum(map(int, lines[1].split())))\n",
        "pass",
    ),
    "extra spaces and blank lines": (
        f"input()\nprint('  ', {SUM}, '  ')\nprint()\nprint()\n",
        "pass",
    ),
    "no final newline": (f"import sys\ninput()\nsys.stdout.write(str({SUM}))\n", "pass"),
    "main guard": (
        f"def main():\n    input()\n    print({SUM})\nif __name__ == '__main__':\n    main()\n",
        "pass",
    ),
    "exit() after printing": (SUMS + "exit()\n", "pass"),
    "sys.exit(0) after printing": ("import sys\n" + SUMS + "sys.exit(0)\n", "pass"),
    "os.write": ("import os\ninput()\nos.write(1, f'{" + SUM + "}\\n'.encode())\n", "pass"),
    "deep recursion": (
        "import sys\nsys.setrecursionlimit(10000)\n"
        "def s(xs):\n    return xs[0] + s(xs[1:]) if xs else 0\n"
        "input()\nprint(s(list(map(int, input().split())) + [0] * 2000))\n",
        "pass",
    ),
    "off by one": (f"input()\nprint({SUM} + 1)\n", "wrong answer"),
    "prints the max": ("input()\nprint(max(map(int, input().split())))\n", "wrong answer"),
    "reads nothing, prints a constant": ("print(6)\n", "test 2 of 3: wrong answer"),
    "prints nothing": ("pass\n", "expected 1 lines of output, got 0"),
    "answer twice": (
        f"input()\nv = {SUM}\nprint(v)\nprint(v)\n",
        "expected 1 lines of output, got 2",
    ),
    "extra token": (f"input()\nprint({SUM}, 0)\n", "expected 1 tokens, got 2"),
    "answer on stderr only": (
        f"import sys\ninput()\nprint({SUM}, file=sys.stderr)\n",
        "wrong answer",
    ),
    "division by zero": ("input()\nprint(1 // 0)\n", "runtime error (exit code 1): ZeroDivision"),
    "sys.exit(3) after a right answer": (
        "import sys\n" + SUMS + "sys.exit(3)\n",
        "runtime error (exit code 3)",
    ),
    "os._exit(1)": ("import os\nos._exit(1)\n", "runtime error (exit code 1)"),
    "memory hog": ("x = bytearray(4 * 1024 ** 3)\n", "MemoryError"),
    "syntax error": ("print(\n", "SyntaxError"),
    "reads past the input": ("input()\ninput()\ninput()\n", "EOFError"),
    "missing module": ("import numpy\n", "ModuleNotFoundError"),
    "kills itself": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "signal 9"),
    "infinite loop": ("while True:\n    pass\n", "time limit exceeded (1.5 s)"),
    "sleeps": ("import time\ntime.sleep(30)\n", "time limit exceeded"),
    "spins on closed stdin": (
        "import sys\nwhile True:\n    sys.stdin.read()\n",
        "time limit exceeded",
    ),
    "right answer, then spins": (
        f"import sys\ninput()\nprint({SUM}, flush=True)\nwhile True:\n    pass\n",
        "time limit exceeded",
    ),
    "prints forever": ("while True:\n    print('x' * 1000)\n", "output limit exceeded"),
    "prints 2 MB at once": ("print('x' * (2 * 1024 * 1024))\n", "output limit exceeded"),
    "looks for the expected output in its memory": (
        "import gc, re\ninput()\nxs = list(map(int, input().split()))\n"
        "hits = [o for o in gc.get_objects() if isinstance(o, dict) and 'output' in o]\n"
        "print(hits[0]['output'] if hits else sum(xs) + 1)\n",
        "wrong answer",
    ),
    "forges on every descriptor": (
        "import os\nfor fd in range(3, 1024):\n    try:\n"
        "        os.write(fd, b'{\"passed\": true}\\n')\n    except OSError:\n        pass\n"
        "print(0)\n",
        "wrong answer",
    ),
}


@pytest.fixture(scope="module")
def outcomes():
    jobs = [Job(code, TESTS) for code, _ in PROGRAMS.values()]
    return dict(zip(PROGRAMS, run_jobs(jobs, LIMITS, workers=2, chunk=6), strict=True))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_each_program_gets_its_verdict(outcomes, name):
    outcome, want = outcomes[name], PROGRAMS[name][1]
    if want == "pass":
        assert outcome.passed, outcome.reason
        assert outcome.reason == "3/3 tests passed"
    else:
        assert not outcome.passed, f"{name} passed"
        assert want in outcome.reason, outcome.reason


def test_a_program_that_ignores_a_large_input_does_not_hang():
    big = [{"input": "1\n" + "7 " * 2_000_000, "output": "7"}]
    [outcome] = run_jobs([Job("print(8)\n", big)], LIMITS)
    assert not outcome.passed and "wrong answer" in outcome.reason


FLOAT_TESTS = [{"input": "1 3\n", "output": "0.333333\n"}, {"input": "2 3", "output": "0.666667"}]


@pytest.mark.parametrize(
    "program, tolerance, passed",
    [
        ("a, b = map(int, input().split())\nprint(a / b)\n", {"abs_tol": 1e-6}, True),
        ("a, b = map(int, input().split())\nprint(f'{a / b:.6f}')\n", {}, True),
        ("a, b = map(int, input().split())\nprint(a / b)\n", {}, False),  # exact tokens
        ("a, b = map(int, input().split())\nprint(a / b + 1e-4)\n", {"abs_tol": 1e-6}, False),
        ("a, b = map(int, input().split())\nprint(a / b * 1.00001)\n", {"rel_tol": 1e-4}, True),
        ("a, b = map(int, input().split())\nprint(a / b * 1.001)\n", {"rel_tol": 1e-4}, False),
        ("print('nan')\n", {"abs_tol": 1.0}, False),
    ],
)
def test_float_tolerance(program, tolerance, passed):
    limits = Limits(timeout_s=5, **tolerance)
    [outcome] = run_jobs([Job(program, FLOAT_TESTS)], limits)
    assert outcome.passed is passed, outcome.reason


def test_the_verifier_reads_stdio_tests_from_the_prompt():
    batch = pl.DataFrame(
        {
            "candidate_id": ["right", "wrong"],
            "text": [
                "```python\n" + PROGRAMS["input()"][0] + "```",
                PROGRAMS["off by one"][0],
            ],
            "prompt": ["Sum the numbers.", "Sum the numbers."],
            "tests": [json.dumps(TESTS)] * 2,
            "meta": ["{}", "{}"],
        }
    )
    out = UnitTests(timeout_s=5).run(batch)
    assert out["passed"].to_list() == [True, False]
    assert out["reason"][1] == (
        "test 1 of 3: wrong answer on line 1: expected '6', got '7' (0/3 tests passed)"
    )
    assert out["score"].to_list() == [1.0, 0.0]
