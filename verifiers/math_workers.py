"""Worker processes for the math verifier: sympy work with a deadline that holds anywhere.

math-verify's own timeout is signal.alarm, which only works in a main thread; sympy can
also spend minutes in C code that no signal interrupts. So candidates that need sympy
run in a small persistent pool of plain subprocesses (`python -m`, so nothing depends on
fork, the caller's thread or its `__main__`: it works in threads and in Ray tasks). A
worker still busy at a candidate's deadline is killed and replaced; that candidate fails
with "timed out" and the rest of the batch goes on. Workers exit with their parent: on
EOF on stdin, when the parent process is gone, and through an atexit hook.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections import deque

from thresher.verifiers.base import Verdict

MAX_WORKERS = 16
_START_TIMEOUT_S = 120  # a worker not ready by then is broken (imports sympy on start)
_MEMORY_LIMIT = 4 << 30  # address space per worker: a runaway expression fails, not the host
_READY = "ready"


class _Worker:
    """One worker process and the candidate it is working on."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "thresher.verifiers.math_workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""
        self.ready = False
        self.spawned = time.monotonic()
        self.job: int | None = None
        self.started = 0.0

    def send(self, index: int, job: tuple) -> None:
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        self.proc.stdin.flush()
        self.job, self.started = index, time.monotonic()

    def lines(self) -> list[str] | None:
        """Complete lines that arrived, or None at EOF (the worker is gone)."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *done, self.buffer = self.buffer.split(b"\n")
        return [line.decode() for line in done]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WorkerPool:
    """A fixed number of math workers, started lazily and replaced when killed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()

    def check(self, jobs: list[tuple], timeout_s: float) -> list[tuple[Verdict, float]]:
        """(verdict, elapsed ms) per (text, reference, pattern) job, each within timeout_s."""
        with self.lock:
            return _Batch(self, jobs, timeout_s).run()

    def replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker()
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def drop_busy(self) -> None:
        """Kill the workers still on a job (after an interrupted batch); fill() replaces them."""
        for w in [w for w in self.workers if w.job is not None]:
            w.kill()
            self.workers.remove(w)

    def fill(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(_Worker())

    def close(self) -> None:
        """Stop every worker (closing stdin ends an idle one; the rest are killed)."""
        for w in self.workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 1
        for w in self.workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers = []


class _Batch:
    """One batch of jobs spread over the pool's workers."""

    def __init__(self, pool: WorkerPool, jobs: list[tuple], timeout_s: float) -> None:
        self.pool, self.jobs, self.timeout_s = pool, jobs, timeout_s
        self.pending = deque(range(len(jobs)))
        self.results: list[tuple[Verdict, float] | None] = [None] * len(jobs)
        self.left = len(jobs)
        self.failed_starts = 0
        self.selector = selectors.DefaultSelector()

    def run(self) -> list[tuple[Verdict, float]]:
        self.pool.fill()
        for w in self.pool.workers:
            self.selector.register(w.fd, selectors.EVENT_READ, w)
        try:
            while self.left:
                self._dispatch()
                for key, _ in self.selector.select(self._wait()):
                    self._read(key.data)
                self._enforce_deadlines()
        finally:
            self.selector.close()
            self.pool.drop_busy()  # interrupted: a late reply must not reach the next batch
        return self.results  # type: ignore[return-value]

    def _dispatch(self) -> None:
        for w in list(self.pool.workers):
            if w.ready and w.job is None and self.pending:
                index = self.pending.popleft()
                try:
                    w.send(index, self.jobs[index])
                except (BrokenPipeError, OSError):  # died while idle: retry elsewhere
                    self.pending.appendleft(index)
                    w.job = None
                    self._replace(w)

    def _wait(self) -> float:
        now, ends = time.monotonic(), []
        for w in self.pool.workers:
            if w.job is not None:
                ends.append(w.started + self.timeout_s)
            elif not w.ready:
                ends.append(w.spawned + _START_TIMEOUT_S)
        return max(0.0, min(ends) - now) if ends else 1.0

    def _read(self, w: _Worker) -> None:
        lines = w.lines()
        if lines is None:
            self._finish(w, Verdict(0.0, False, "verifier worker died while judging this answer"))
            self._replace(w)
            return
        for line in lines:
            if line == _READY:
                w.ready = True
                self.failed_starts = 0
            elif w.job is not None:
                try:
                    score, passed, reason = json.loads(line)
                except ValueError:
                    self._finish(w, Verdict(0.0, False, "verifier worker sent a malformed reply"))
                    self._replace(w)
                    return
                self._finish(w, Verdict(score, passed, reason))

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for w in list(self.pool.workers):
            if w.job is not None and now >= w.started + self.timeout_s:
                why = f"timed out after {self.timeout_s:g} s"
                self._finish(w, Verdict(0.0, False, why))
                self._replace(w)
            elif not w.ready and now >= w.spawned + _START_TIMEOUT_S:
                self._replace(w)

    def _finish(self, w: _Worker, verdict: Verdict) -> None:
        if w.job is None:
            return
        self.results[w.job] = (verdict, (time.monotonic() - w.started) * 1000)
        self.left -= 1
        w.job = None

    def _replace(self, w: _Worker) -> None:
        if not w.ready:
            self.failed_starts += 1
            if self.failed_starts > 3 * self.pool.size:
                raise RuntimeError("math verifier workers exit on start; see their stderr")
        self.selector.unregister(w.fd)
        fresh = self.pool.replace(w)
        self.selector.register(fresh.fd, selectors.EVENT_READ, fresh)


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def pool_size() -> int:
    """One worker per CPU this process may use (inside a Ray task: the CPUs it was given)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            assigned = ray.get_runtime_context().get_assigned_resources().get("CPU")
            cpus = int(assigned) if assigned else cpus
        except Exception:  # the driver, or an older Ray: keep the machine's count
            pass
    return max(1, min(cpus or 1, MAX_WORKERS))


def worker_pool() -> WorkerPool:
    """This process's pool (a forked child gets its own, not its parent's pipes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = WorkerPool(pool_size())
            atexit.register(_POOL.close)
        return _POOL


def check_in_workers(jobs: list, timeout_s: float) -> list[tuple[Verdict, float]]:
    """(verdict, elapsed ms) per job, each killed after timeout_s: a (text, reference,
    pattern) math job, or a dict job of another verifier (`kind` names it)."""
    return worker_pool().check(jobs, timeout_s)


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            os._exit(0)


def _limit_memory() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > _MEMORY_LIMIT:
        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, hard))


def _other_job(job: dict) -> Verdict:
    """A job of a verifier that shares these workers (their deadlines and memory limit)."""
    kind = job.get("kind")
    if kind == "reasoning_gym":
        from thresher.verifiers.envs import score_in_worker  # local: cycle with verifiers.envs

        return score_in_worker(job)
    return Verdict(0.0, False, f"unknown worker job kind {kind!r}")


def main() -> None:
    """The worker: read (text, reference, pattern) lines, write (score, passed, reason) lines."""
    import logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the replies
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _limit_memory()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from thresher.verifiers.math_answer import check_full  # local: cycle with verifiers.math_answer

    check_full(r"\boxed{\frac{1}{2}}", "0.5")  # imports and first-parse set-up, before "ready"
    reply.write(_READY + "\n")
    reply.flush()
    for line in sys.stdin:
        job = json.loads(line)
        if isinstance(job, dict):  # another verifier's job: {"kind": ..., its fields}
            verdict = _other_job(job)
        else:
            text, reference, pattern = job
            try:
                verdict = check_full(text, reference, pattern)
            except Exception as e:  # a bug or odd input: this candidate fails, the worker lives
                verdict = Verdict(0.0, False, f"math verifier error: {type(e).__name__}")
        reply.write(json.dumps([verdict.score, verdict.passed, verdict.reason]) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
