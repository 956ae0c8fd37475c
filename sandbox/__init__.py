"""Run untrusted code against trusted tests in a sandbox; a referee the code cannot reach decides.

One sandbox (bubblewrap: no network, read-only system, private /tmp, nothing of the
pipeline's files or environment, an unprivileged user) runs the harness as its init
process: the referee. The referee takes a list of jobs on stdin and runs each job's tests
itself, against candidate processes started from a clean starter process that never
sees a test: function calls cross a socket as plain values, programs' outputs are
compared in the referee. So exit codes, printed text, patched builtins, objects that equal
everything and walks through the candidate's own interpreter decide nothing. Several
sandboxes run in parallel, each taking a chunk of jobs.

The harness is one stdlib-only script: the texts of `protocol.py`, `candidate.py`,
`programs.py` and `referee.py` joined in that order. The pipeline imports those modules
only for their helpers (`protocol.decode`, `programs.compare_output`).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

NOBODY = 65534

HARNESS_PARTS = ("protocol.py", "candidate.py", "programs.py", "referee.py")


def harness_source() -> str:
    """The harness script: its parts' texts in order, without their imports of each other."""
    texts = ["from __future__ import annotations\n"]
    for name in HARNESS_PARTS:
        text = Path(__file__).with_name(name).read_text()
        lines = text.splitlines(keepends=True)
        for node in reversed(ast.parse(text).body):
            if isinstance(node, ast.ImportFrom) and _joined_away(node.module or ""):
                del lines[node.lineno - 1 : node.end_lineno]
        texts.append("".join(lines))
    return "\n\n".join(texts)


def _joined_away(module: str) -> bool:
    return module == "__future__" or module.startswith("thresher.sandbox")


# Runs inside the sandbox as `python3 -I -S -c HARNESS referee`: standalone, stdlib only.
HARNESS = harness_source()


@dataclass(frozen=True)
class Limits:
    """Per-job limits inside the sandbox, and how program output is compared."""

    timeout_s: float = 10.0  # all of one candidate's tests together
    test_timeout_s: float | None = None  # one test (default: timeout_s)
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    max_procs: int = 32
    tmp_mb: int = 64
    output_mb: float = 16.0  # a program's output, or one value the code returns
    abs_tol: float = 0.0  # stdin/stdout tests: numbers within these tolerances are equal
    rel_tol: float = 0.0


@dataclass(frozen=True)
class Job:
    """Code and its tests.

    `tests` is a list of assert statements, test code (with `check(candidate)` when
    `entry_point` is set), a list of {"input", "output"} dicts for a program that reads
    stdin, or a probe: {"inputs": [...]}, argument lists for `entry_point` (or stdin
    texts without one), whose values come back in the outcome.
    `prompt` is trusted code the referee runs before the tests (HumanEval's helpers).
    `isolation="shared"` runs function tests inside the candidate's process: forgeable.
    """

    code: str
    tests: str | list
    entry_point: str | None = None
    prompt: str | None = None
    isolation: str = "referee"
    tool: bool = False  # run the code with no tests: its output is the outcome's value

    @property
    def mode(self) -> str:
        if self.tool:
            return "tool"
        if isinstance(self.tests, dict):
            return "probe"
        if isinstance(self.tests, list) and self.tests and isinstance(self.tests[0], dict):
            return "stdio"
        return "shared" if self.isolation == "shared" else "calls"

    def payload(self) -> dict:
        return {
            "mode": self.mode,
            "code": self.code,
            "tests": self.tests,
            "entry_point": self.entry_point,
            "prompt": self.prompt if self.entry_point else None,
        }


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str
    elapsed_ms: float
    tests_passed: int | None = None  # of tests_total; None: no test was counted
    tests_total: int | None = None
    values: list | None = None  # a probe's {"ok": value} or {"error": why} per input

    @property
    def score(self) -> float:
        """The share of tests passed (all or nothing where tests were not counted)."""
        if self.tests_total:
            return (self.tests_passed or 0) / self.tests_total
        return float(self.passed)


_WARNED = {"done": False}


def bwrap_path() -> str | None:
    """The bubblewrap binary, if installed."""
    return shutil.which("bwrap")


def _interpreter() -> str:
    # The system python is readable by an unprivileged user; a pyenv/venv under /root is not.
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return os.path.realpath(sys.executable)


def sandbox_command(limits: Limits) -> tuple[list[str], bool]:
    """The command that starts one harness, and whether it is really sandboxed."""
    python = _interpreter()
    harness = [python, "-I", "-S", "-c", HARNESS, "referee"]
    bwrap = bwrap_path()
    if not bwrap:
        if not _WARNED["done"]:
            _WARNED["done"] = True
            warnings.warn(
                "bubblewrap (bwrap) is not installed: candidate code runs WITHOUT a sandbox, "
                "with resource limits only. Install it (apt-get install bubblewrap) before "
                "running untrusted code.",
                RuntimeWarning,
                stacklevel=3,
            )
        return harness, False
    binds = []
    for path in ("/usr", "/lib", "/lib64", "/bin", "/lib32", "/libx32"):
        if os.path.exists(path):
            binds += ["--ro-bind", path, path]
    prefix = os.path.dirname(os.path.dirname(python))
    if not prefix.startswith(("/usr", "/bin")):
        binds += ["--ro-bind", prefix, prefix]
    cmd = [
        bwrap,
        *binds,
        "--size",
        str(limits.tmp_mb * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # --as-pid-1: the referee is the namespace's init, which its children cannot signal
        "--unshare-all",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--chdir",
        "/tmp",
        *harness,
    ]
    return cmd, True


def _run_chunk(jobs: list[Job], limits: Limits) -> list[Outcome]:
    cmd, sandboxed = sandbox_command(limits)
    payload = json.dumps(
        {"source": HARNESS, "limits": asdict(limits), "jobs": [j.payload() for j in jobs]}
    )
    env = {"PATH": "/usr/bin:/bin"} if not sandboxed else None
    # the referee enforces each job's timeout; this one only catches a stuck referee
    backstop = limits.timeout_s * len(jobs) + 30
    # as root, run as `nobody`: the process-count limit then holds, and without a sandbox
    # a candidate's kill(-1) or file writes cannot reach the pipeline's processes or files
    drop = os.getuid() == 0 and _interpreter().startswith("/usr")
    user = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if drop else {}
    try:
        proc = subprocess.run(
            cmd,
            input=payload,
            capture_output=True,
            text=True,
            timeout=backstop,
            env=env,
            cwd="/tmp",
            **user,
        )
        lines = proc.stdout.splitlines()
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        lines = (out.decode(errors="replace") if isinstance(out, bytes) else out).splitlines()
    outcomes = []
    for line in lines[: len(jobs)]:
        try:
            r = json.loads(line)
            counts = r.get("counts") or [None, None]
            outcomes.append(
                Outcome(
                    bool(r["passed"]),
                    str(r["reason"]),
                    float(r["elapsed_ms"]),
                    counts[0],
                    counts[1],
                    r.get("values"),
                )
            )
        except (ValueError, KeyError, TypeError):
            outcomes.append(Outcome(False, "the referee's output was unreadable", 0.0))
    if len(outcomes) < len(jobs):
        # the sandbox died during the next job: that job fails, the rest get a new sandbox
        outcomes.append(Outcome(False, "the sandbox stopped while this code ran", 0.0))
        outcomes += _run_chunk(jobs[len(outcomes) :], limits)
    return outcomes


def run_jobs(
    jobs: list[Job], limits: Limits | None = None, workers: int | None = None, chunk: int = 16
) -> list[Outcome]:
    """Run every job in sandboxes, `workers` at a time; one outcome per job, in order."""
    limits = limits or Limits()
    workers = workers or os.cpu_count() or 1
    if not jobs:
        return []
    size = max(1, min(chunk, -(-len(jobs) // workers)))
    chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(lambda c: _run_chunk(c, limits), chunks)
    return [o for part in results for o in part]


@dataclass(frozen=True)
class ToolRun:
    """What one tool call printed: stdout, the stderr tail, and why it failed ('' if not)."""

    stdout: str
    stderr: str
    error: str
    elapsed_ms: float

    @property
    def status(self) -> str:
        """ok, error or timeout."""
        if not self.error:
            return "ok"
        return "timeout" if self.error.startswith("time limit") else "error"


def run_code(
    codes: list[str], limits: Limits | None = None, workers: int | None = None
) -> list[ToolRun]:
    """Run each code as a program in the sandbox, with nothing of the prompt's reference or
    tests; what each printed, one per code, in order."""
    runs = []
    for outcome in run_jobs([Job(code, [], tool=True) for code in codes], limits, workers):
        value = (outcome.values or [{}])[0] if outcome.values else {}
        error = value.get("error", outcome.reason if not outcome.passed else "")
        runs.append(
            ToolRun(value.get("stdout", ""), value.get("stderr", ""), error, outcome.elapsed_ms)
        )
    return runs
