"""Run untrusted Python with tests in a sandbox; pass only on the harness's own signal.

One sandbox (bubblewrap: no network, read-only system, private /tmp, nothing of the
pipeline's files or environment, an unprivileged user) runs a harness that takes a
list of jobs on stdin. For each job the harness forks a child that sets CPU, memory,
process-count and file-size limits, drops every inherited descriptor, runs the code
and then the tests, and finally writes a fresh random token to a pipe only the harness
reads. The harness reports a job as passed only when that token arrives with every test
counted as passed: exit codes, exceptions swallowed by `sys.exit`, `os._exit` and
anything the code prints count for nothing. Several sandboxes run in parallel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

NOBODY = 65534

# The harness runs inside the sandbox with `python3 -I -S -c HARNESS`; keep it standalone.
HARNESS = r"""
import ctypes, json, os, resource, select, signal, sys, time

def limit(cfg):
    mb = 1024 * 1024
    for name, value in (("RLIMIT_CPU", cfg["cpu_s"]), ("RLIMIT_AS", cfg["memory_mb"] * mb),
                        ("RLIMIT_FSIZE", cfg["file_mb"] * mb), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NPROC", cfg["max_procs"])):
        resource.setrlimit(getattr(resource, name), (value, value))

def run_job(job, write_fd, token):
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(job["code"], "<candidate>", "exec"), ns)
    passed = total = 0
    failure = ""
    tests = job["tests"]
    if isinstance(tests, list):
        for t in tests:
            total += 1
            try:
                exec(compile(t, "<test>", "exec"), ns)
                passed += 1
            except Exception as e:
                failure = failure or f"{t[:200]!r} failed: {type(e).__name__}: {str(e)[:200]}"
    else:
        total = 1
        exec(compile(tests, "<tests>", "exec"), ns)
        entry = job.get("entry_point")
        if entry and callable(ns.get("check")):
            ns["check"](ns[entry])
        passed = 1
    line = f"{token} {passed} {total}" if not failure else f"FAIL {failure}"
    os.write(write_fd, line.encode()[:2048])

def child(job, cfg, write_fd, token):
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, write_fd)
    os.closerange(write_fd + 1, 1 << 16)
    limit(cfg)
    try:
        run_job(job, write_fd, token)
    except BaseException as e:
        try:
            os.write(write_fd, f"FAIL {type(e).__name__}: {str(e)[:300]}".encode())
        except BaseException:
            pass
    os._exit(0)

def reap():
    # as the namespace's init, the harness inherits orphans: collect them
    while True:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not got:
            return

def main():
    try:  # no other process of this user may read our memory or descriptors
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass
    data = json.loads(sys.stdin.read())
    sys.stdin.close()
    cfg = data["limits"]
    out = sys.stdout
    for job in data["jobs"]:
        token = os.urandom(16).hex()
        r, w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(job, cfg, w, token)
        os.close(w)
        deadline = start + cfg["timeout_s"]
        chunks, status, timed_out = [], None, False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], min(left, 0.05))
            if ready:
                data_ = os.read(r, 4096)
                if data_ and sum(map(len, chunks)) < 8192:
                    chunks.append(data_)
                if not data_:  # the child closed the pipe: wait for it
                    got, status = os.waitpid(pid, os.WNOHANG)
                    if got:
                        break
            else:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    break
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if status is None:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        reap()
        os.close(r)
        text = b"".join(chunks).decode("utf-8", "replace")
        parts = text.split()
        ok = len(parts) == 3 and parts[0] == token and parts[1] == parts[2] and parts[2] != "0"
        if timed_out:
            reason = f"timed out after {cfg['timeout_s']} s"
        elif ok:
            reason = f"{parts[1]}/{parts[2]} tests passed"
        elif text.startswith("FAIL "):
            reason = text[5:].split("FAIL ")[0][:300]
        elif parts and parts[0] == token:
            reason = f"{parts[1]}/{parts[2]} tests passed"
        elif status is not None and os.WIFSIGNALED(status):
            reason = f"killed by signal {os.WTERMSIG(status)}"
        else:
            reason = "exited before the tests finished"
        out.write(json.dumps({"passed": ok, "reason": reason,
                              "elapsed_ms": (time.monotonic() - start) * 1000}) + "\n")
        out.flush()

main()
"""


@dataclass(frozen=True)
class Limits:
    """Per-job limits inside the sandbox."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    max_procs: int = 32
    tmp_mb: int = 64


@dataclass(frozen=True)
class Job:
    """Code and its tests: a list of assert statements, or test code (with `check`)."""

    code: str
    tests: str | list[str]
    entry_point: str | None = None


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str
    elapsed_ms: float


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
    harness = [python, "-I", "-S", "-c", HARNESS]
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
        # --as-pid-1: the harness is the namespace's init, which its children cannot signal
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
        {
            "limits": limits.__dict__,
            "jobs": [
                {"code": j.code, "tests": j.tests, "entry_point": j.entry_point} for j in jobs
            ],
        }
    )
    env = {"PATH": "/usr/bin:/bin"} if not sandboxed else None
    # the harness enforces each job's timeout; this one only catches a stuck harness
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
        lines = (e.stdout or b"").decode(errors="replace").splitlines() if e.stdout else []
    outcomes = []
    for line in lines[: len(jobs)]:
        try:
            r = json.loads(line)
            outcomes.append(Outcome(bool(r["passed"]), str(r["reason"]), float(r["elapsed_ms"])))
        except (ValueError, KeyError, TypeError):
            outcomes.append(Outcome(False, "harness output unreadable", 0.0))
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
