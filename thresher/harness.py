"""The referee and the candidate runner that live inside the code sandbox (stdlib only).

This file is not imported by the pipeline: `sandbox.py` runs its text with
`python3 -I -S -c SOURCE referee` inside bubblewrap, where it is the namespace's init.

Roles, each its own process:

- the referee (pid 1 of the sandbox): reads the jobs on stdin, runs the tests, which are
  trusted data, and prints one verdict per job. Candidates cannot signal it (init
  ignores signals it has no handler for), read its memory or descriptors (it is not
  dumpable), or reach its interpreter.
- the starter: a fresh interpreter started by the referee before any candidate runs; it
  never sees a test. For each candidate process it forks itself, so the candidate's
  memory holds nothing but the starter and the candidate's own code.
- the candidate: runs the code under resource limits. With function tests it answers
  calls from the referee: arguments and results cross a socket as plain values (numbers,
  strings, bytes, None, booleans, tuples, lists, dicts, sets, exact built-in types
  only), so every comparison happens in the referee. With stdin/stdout tests it is a
  program whose output the referee compares. With `isolation: shared` it runs the tests
  itself and reports the count, which the candidate can forge.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import select
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False  # no typing import at run time: annotations only
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any, NoReturn

MAX_DEPTH = 100
HEADER = struct.Struct(">I")
PREIMPORT = (
    "math re itertools collections functools heapq bisect string typing fractions decimal "
    "statistics random hashlib copy operator datetime array types"
)


# -- plain values ----------------------------------------------------------------------


class NotPlain(Exception):
    """A value that may not cross between the candidate and the referee."""


def encode(value: Any, depth: int = 0) -> Any:
    """A JSON-able form of a plain value; NotPlain for anything else (subclasses too)."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels")
    t = type(value)
    if value is None or t is bool or t is str or t is float:
        return value
    if t is int:
        return value if -(1 << 53) < value < (1 << 53) else {"x": format(value, "x")}
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple or t is set or t is frozenset:
        tag = {tuple: "t", set: "s", frozenset: "f"}[t]
        return {tag: [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    name = getattr(t, "__qualname__", "?")
    raise NotPlain(f"an object of type {name}" if type(name) is str else "an object")


def decode(obj: Any, depth: int = 0) -> Any:
    """The plain value an `encode` form stands for; NotPlain for anything malformed."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels")
    t = type(obj)
    if obj is None or t is bool or t is int or t is float or t is str:
        return obj
    if t is list:
        return [decode(v, depth + 1) for v in obj]
    if t is dict and len(obj) == 1:
        ((tag, body),) = obj.items()
        try:
            return _decode_tagged(tag, body, depth)
        except (TypeError, ValueError, OverflowError):
            pass
    raise NotPlain("a malformed value")


def _decode_tagged(tag, body, depth):
    if tag == "x" and type(body) is str and len(body) < 200_000:
        return int(body, 16)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        if all(type(v) in (int, float) for v in body):
            return complex(body[0], body[1])
    if type(body) is not list:
        raise NotPlain("a malformed value")
    if tag == "d":
        pairs = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlain("a malformed value")
            pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
        return dict(pairs)
    items = [decode(v, depth + 1) for v in body]
    kinds = {"t": tuple, "s": set, "f": frozenset}
    if tag in kinds:
        return kinds[tag](items)
    raise NotPlain("a malformed value")


def short(value: Any, n: int = 80) -> str:
    """repr() cut to n characters."""
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


# -- framing ---------------------------------------------------------------------------


class Timeout(BaseException):
    """The deadline passed."""


class Gone(Exception):
    """The other end closed the connection."""


def send_msg(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(data)) + data)


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout()
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except TimeoutError:
            raise Timeout() from None
        if not chunk:
            raise Gone()
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_msg(sock: socket.socket, cap: int, deadline: float | None = None) -> Any:
    (n,) = HEADER.unpack(recv_exact(sock, HEADER.size, deadline))
    if n > cap:
        raise OverflowError(f"a message of {n} bytes (the limit is {cap})")
    return json.loads(recv_exact(sock, n, deadline))


# -- counting assertions ---------------------------------------------------------------

COUNTER = "__thresher_assert__"


class _CountAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        call = ast.Expr(ast.Call(ast.Name(COUNTER, ast.Load()), [], []))
        return [ast.copy_location(call, node), node]


def compile_counted(source: str, filename: str) -> CodeType:
    """Compile test code so that each assert statement reached calls COUNTER first."""
    tree = _CountAsserts().visit(ast.parse(source, filename))
    return compile(ast.fix_missing_locations(tree), filename, "exec")


def has_assert(source: str) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(source)))


# -- the candidate process -------------------------------------------------------------


def set_limits(limits: dict[str, Any]) -> None:
    import resource

    mb = 1024 * 1024
    cpu = int(limits["cpu_s"])
    # SIGXCPU at the soft limit names the cause; SIGKILL a second later if it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (
        ("RLIMIT_AS", int(limits["memory_mb"]) * mb),
        ("RLIMIT_FSIZE", int(limits["file_mb"]) * mb),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_NPROC", int(limits["max_procs"])),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def candidate_main(header: dict[str, Any], fds: list[int]) -> NoReturn:
    """The forked candidate: wire descriptors, set limits, read the code, run it; never returns."""
    os.setsid()
    data, errs = fds[0], (fds[1] if len(fds) > 1 else None)
    devnull = os.open(os.devnull, os.O_RDWR)
    stdio = header["mode"] == "stdio"
    if stdio:
        os.dup2(data, 0)
        os.dup2(data, 1)
        os.dup2(errs if errs is not None else devnull, 2)
        os.closerange(3, 1 << 16)
    else:
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.dup2(data, 3)
        os.closerange(4, 1 << 16)
    set_limits(header["limits"])
    sys.set_int_max_str_digits(0)
    builtins.exit = builtins.quit = sys.exit  # `-S` leaves them out; programs use them
    sock = socket.socket(fileno=0 if stdio else 3)
    try:
        msg = recv_msg(sock, 1 << 30)
    except BaseException:
        os._exit(3)
    if stdio:
        sock.detach()
        run_program(msg["code"])
    elif header["mode"] == "shared":
        run_shared(sock, msg)
    serve_calls(sock, msg["code"])


def run_program(code: str) -> NoReturn:
    """Run a stdin/stdout program as __main__; exit 1 with the error on stderr if it raises."""
    import io

    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8")
    status = 0
    try:
        exec(compile(code, "<candidate>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        status = e.code if type(e.code) is int else (0 if e.code is None else 1)
    except BaseException as e:
        status = 1
        try:
            import traceback

            # as the interpreter prints it, from the candidate's own frames on
            lines = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
            last = f"{type(e).__name__}: {str(e)[:300]}"
            sys.stderr.write("\n" + "".join(lines[:-1])[-1500:] + last + "\n")
        except BaseException:
            try:
                sys.stderr.write(f"\n{type(e).__name__}: {str(e)[:300]}\n")
            except BaseException:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 1
    os._exit(status)


def _callables(ns):
    out = []
    for name, value in list(ns.items()):
        if type(name) is str and not name.startswith("__") and callable(value):
            if not isinstance(value, type(os)):
                out.append(name)
    return out[:10_000]


def serve_calls(sock: socket.socket, code: str) -> NoReturn:
    """Load the code, report its callables, then answer the referee's calls until it hangs up."""
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(code, "<candidate>", "exec"), ns)
        send_msg(sock, {"ready": _callables(ns)})
    except (SystemExit, KeyboardInterrupt) as e:
        send_msg(sock, {"load_error": f"tried to exit while loading ({_describe(e)})"})
        os._exit(1)
    except BaseException as e:
        send_msg(sock, {"load_error": f"raised while loading: {_describe(e)}"})
        os._exit(1)
    while True:
        try:
            msg = recv_msg(sock, 1 << 30)
        except BaseException:
            os._exit(0)
        reply = _answer(ns, msg)
        reply["id"] = msg.get("id") if type(msg) is dict else None
        send_msg(sock, reply)


def _answer(ns, msg):
    try:
        fn = ns[msg["call"]]
        args, kwargs = decode(msg["args"]), decode(msg["kwargs"])
    except BaseException as e:
        return {"raised": ["TypeError", f"bad call: {_describe(e)}"]}
    try:
        result = fn(*args, **kwargs)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as e:
        return {"exit": type(e).__name__}
    except BaseException as e:
        return {"raised": [type(e).__name__, _text(e)]}
    try:
        return {"ok": encode(result)}
    except NotPlain as e:
        return {"refused": str(e)}
    except RecursionError:
        return {"refused": f"a value nested deeper than {MAX_DEPTH} levels"}


def _text(e):
    try:
        return str(e)[:300]
    except BaseException:
        return "?"


def _describe(e):
    text = _text(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_shared(sock: socket.socket, msg: dict[str, Any]) -> NoReturn:
    """isolation: shared: run code and tests in this process and report (forgeable) counts."""
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    counted = [0]
    ns[COUNTER] = lambda: counted.__setitem__(0, counted[0] + 1)
    passed, total, failure = 0, 0, ""
    try:
        exec(compile(msg["code"], "<candidate>", "exec"), ns)
        tests, entry = msg["tests"], msg.get("entry_point")
        if isinstance(tests, list):
            for i, test in enumerate(tests, 1):
                if not has_assert(test):
                    exec(compile_counted(test, "<setup>"), ns)
                    continue
                total += 1
                try:
                    exec(compile_counted(test, f"<test {i}>"), ns)
                    passed += 1
                except Exception as e:
                    failure = failure or f"test {i} failed: {short(test, 120)}: {_describe(e)}"
        else:
            total = 1
            exec(compile_counted(tests, "<tests>"), ns)
            if entry and callable(ns.get("check")):
                ns["check"](ns[entry])
            passed = 1
    except BaseException as e:
        failure = failure or _describe(e)
    send_msg(sock, {"shared": [passed, total, failure, counted[0]]})
    os._exit(0)


# -- the starter -----------------------------------------------------------------------


def not_dumpable() -> None:
    """Forbid ptrace and /proc access to this process by others of the same user."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass


def starter_main(fd: int) -> NoReturn:
    """Fork a candidate process for each request of the referee and report its exit status."""
    not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PREIMPORT.split():
        try:
            __import__(name)
        except ImportError:
            pass
    ctl = socket.socket(fileno=fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 65536, 4)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)
        header = json.loads(data)
        pid = os.fork()
        if pid == 0:
            ctl.close()
            try:
                candidate_main(header, fds)
            finally:
                os._exit(4)
        for f in fds:
            os.close(f)
        ctl.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        ctl.send(json.dumps({"exit": status}).encode())


# -- the referee -----------------------------------------------------------------------


class Stop(BaseException):
    """Ends a job as failed, whatever the test code catches; `reason` says why."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Starter:
    """The referee's handle on the starter process (restarted if a candidate kills it)."""

    def __init__(self, source):
        self.source = source
        self.pid = None
        self._start()

    def _start(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        argv = [sys.executable, "-I", "-S", "-c", self.source, "starter", str(theirs.fileno())]
        quiet = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1),
            (os.POSIX_SPAWN_DUP2, 0, 2),
        ]
        self.pid = os.posix_spawn(
            sys.executable, argv, {"PATH": "/usr/bin:/bin"}, file_actions=quiet
        )
        theirs.close()
        self.ctl = ours

    def _restart(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.ctl.close()
        self._start()

    def _read(self, timeout):
        ready, _, _ = select.select([self.ctl], [], [], max(timeout, 0))
        if not ready:
            return None
        try:
            data = self.ctl.recv(4096)
        except OSError:
            return None
        return json.loads(data) if data else None

    def spawn(self, mode, limits):
        """A new candidate process: (pid, data socket, stderr socket or None)."""
        for _ in (0, 1):
            data, data_theirs = socket.socketpair()
            errs = errs_theirs = None
            fds = [data_theirs.fileno()]
            if mode == "stdio":
                errs, errs_theirs = socket.socketpair()
                fds.append(errs_theirs.fileno())
            try:
                header = json.dumps({"mode": mode, "limits": limits}).encode()
                socket.send_fds(self.ctl, [header], fds)
                reply = self._read(10)
            except OSError:
                reply = None
            finally:
                data_theirs.close()
                if errs_theirs is not None:
                    errs_theirs.close()
            if reply and "pid" in reply:
                return reply["pid"], data, errs
            data.close()
            if errs is not None:
                errs.close()
            self._restart()
        raise Stop("the sandbox could not start the candidate's process")

    def exit_status(self, timeout):
        """The last candidate's wait status, or None if the starter did not say in time."""
        reply = self._read(timeout)
        if reply and "exit" in reply:
            return reply["exit"]
        self._restart()
        return None


class Referee:
    """Runs jobs one after another: each against fresh candidate processes."""

    def __init__(self, source, limits):
        self.limits = limits
        self.starter = Starter(source)
        self.cap = int(limits["output_mb"] * 1024 * 1024)
        self.armed = self.fired = False
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum, frame):
        # a candidate can send SIGALRM too: at worst it fails its own job
        if self.armed:
            self.armed = False
            self.fired = True
            raise Timeout()

    def arm(self, seconds):
        self.armed, self.fired = True, False
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))

    def disarm(self):
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def run(self, job):
        start = time.monotonic()
        deadline = start + float(self.limits["timeout_s"])
        self.counts, self.values = None, None
        try:
            if job["mode"] == "probe":
                passed, reason = self.run_probe(job, deadline)
            elif job["mode"] == "tool":
                passed, reason = self.run_tool(job, deadline)
            elif job["mode"] == "stdio":
                passed, reason = self.run_stdio(job, deadline)
            elif job["mode"] == "shared":
                passed, reason = self.run_shared(job, deadline)
            else:
                passed, reason = self.run_calls(job, deadline)
        except Stop as e:
            passed, reason = False, e.reason
        except Timeout:
            passed, reason = False, f"timed out after {self.limits['timeout_s']} s"
        except Exception as e:  # a fault of the referee or of the tests, never a pass
            passed, reason = False, f"the referee could not run the tests: {_describe(e)}"
        finally:
            self.disarm()
            self.clean_up()
        counts = self.counts
        if counts and not passed and counts[0] >= counts[1]:
            counts = [0, counts[1]]  # every test ran clean, yet it failed: nothing passed
        return {
            "passed": bool(passed),
            "reason": reason[:400],
            "elapsed_ms": (time.monotonic() - start) * 1000,
            "counts": counts,
            "values": self.values,
        }

    def per_test(self):
        """One test's time limit: test_timeout_s, else the job's."""
        return float(self.limits.get("test_timeout_s") or self.limits["timeout_s"])

    def clean_up(self):
        """Kill every process but the referee and the starter; empty /tmp (inside a sandbox)."""
        if os.getpid() != 1:
            return
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, self.starter.pid):
                try:
                    os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass
        reap()
        import shutil

        for entry in os.listdir("/tmp"):
            path = os.path.join("/tmp", entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def finish(self, pid):
        """Kill a candidate's process group; its wait status."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        return self.starter.exit_status(5)

    # -- function tests ----------------------------------------------------------------

    def run_calls(self, job, deadline):
        pid, sock, _ = self.starter.spawn("calls", self.limits)
        conn = Conn(sock, self.cap, deadline)
        try:
            send_msg(sock, {"code": job["code"]})
            names = conn.ready()
            ns = self.namespace(job, conn, names)
            return self.run_tests(job, conn, ns, deadline)
        finally:
            sock.close()
            self.finish(pid)

    def namespace(self, job, conn, names):
        """Test globals: a proxy per candidate function.

        Builtins, the prompt's code and the tests' own definitions win over the candidate's
        names, so the candidate cannot stand in for a helper that the tests check it with.
        """
        ns = {"__name__": "__referee__", "__builtins__": builtins, COUNTER: conn.count_assert}
        for name in names:
            if not hasattr(builtins, name):  # `len` or `sorted` in a test is the real one
                ns[name] = conn.proxy(name)
        entry = job.get("entry_point")
        if entry:
            prompt = job.get("prompt")
            if prompt:
                try:
                    self.arm(deadline_left(conn.deadline))
                    exec(compile(prompt, "<prompt>", "exec"), ns)
                except Exception:
                    pass  # a prompt that is not code defines nothing
                finally:
                    self.disarm()
            if entry not in names:
                raise Stop(f"the code does not define {entry}()")
            ns[entry] = conn.proxy(entry)
        return ns

    def run_tests(self, job, conn, ns, deadline):
        tests, entry = job["tests"], job.get("entry_point")
        per_test = self.per_test()
        if isinstance(tests, list):
            passed = total = 0
            failure = ""
            self.counts = [0, sum(has_assert(t) for t in tests)]
            for i, test in enumerate(tests, 1):
                counts = has_assert(test)
                total += counts
                conn.last = None
                ok, why = self.exec_one(test, f"<test {i}>", ns, conn, deadline, per_test)
                if ok:
                    passed += counts
                    self.counts[0] = passed
                elif not counts:
                    raise Stop(f"setup {short(test, 120)} failed: {why}")
                else:
                    failure = failure or f"test {i} failed: {short(test, 160)}: {why}"
                if conn.stop:
                    raise Stop(conn.stop)
            summary = f"{passed}/{total} tests passed"
            if failure:
                return False, f"{summary}; {failure}"
        else:
            self.counts = [0, 1]  # test code is one test: all or nothing
            ok, why = self.exec_one(tests, "<tests>", ns, conn, deadline, per_test, entry)
            if not ok:
                return False, f"tests failed (test code is one test, all or nothing): {why}"
            self.counts = [1, 1]
            summary = "tests passed"
        if conn.stop:
            return False, conn.stop
        if conn.calls == 0:
            return False, "the tests never called the candidate's code, so they cannot test it"
        if conn.asserts == 0:
            return False, "the tests checked no assertion"
        checked = f"{conn.asserts} assertion{'s' if conn.asserts != 1 else ''}"
        return True, f"{summary} ({checked} checked in the referee)"

    def exec_one(self, source, filename, ns, conn, deadline, per_test, entry=None):
        """Run one test (or test code, then check(entry)) under the time limits."""
        try:
            self.arm(min(per_test, deadline_left(deadline)))
            exec(compile_counted(source, filename), ns)
            if entry and callable(ns.get("check")):
                ns["check"](ns[entry])
            self.disarm()
            if self.fired:  # the test code caught the timeout itself
                raise Timeout()
            return True, ""
        except Timeout:
            self.disarm()
            if deadline_left(deadline) <= 0:
                raise
            conn.stop = conn.stop or f"{filename[1:-1]} timed out after {per_test:g} s"
            return False, "timed out"
        except Stop as e:
            self.disarm()
            conn.stop = conn.stop or e.reason
            return False, e.reason
        except Exception as e:
            self.disarm()
            why = _describe(e)
            if conn.last:
                why += f" ({conn.last})"
            return False, why

    # -- isolation: shared -------------------------------------------------------------

    def run_shared(self, job, deadline):
        pid, sock, _ = self.starter.spawn("shared", self.limits)
        try:
            send_msg(sock, {k: job.get(k) for k in ("code", "tests", "entry_point")})
            try:
                reply = recv_msg(sock, 1 << 20, deadline)
            except Gone:
                return False, "the code exited before the tests finished"
            except (ValueError, OverflowError):
                return False, "the candidate's process sent a malformed report"
        finally:
            sock.close()
            self.finish(pid)
        report = reply.get("shared") if type(reply) is dict else None
        if type(report) is not list or len(report) != 4:
            return False, "the candidate's process sent a malformed report"
        passed, total, failure, asserts = report
        if type(passed) is int and type(total) is int and 0 <= passed <= total:
            self.counts = [passed, total]
        if failure:
            return False, f"{passed}/{total} tests passed; {str(failure)[:300]}"
        if not asserts:
            return False, "the tests checked no assertion"
        return passed == total and total > 0, f"{passed}/{total} tests passed (isolation: shared)"

    # -- stdin/stdout tests ------------------------------------------------------------

    def run_stdio(self, job, deadline):
        """Every test is run (for the share passed) until one runs out of time."""
        tests = job["tests"]
        per_test = self.per_test()
        self.counts = [0, len(tests)]
        failure = ""
        for i, test in enumerate(tests, 1):
            limit = min(per_test, deadline_left(deadline))
            if limit <= 0:
                failure = failure or f"timed out after {self.limits['timeout_s']} s"
                break
            ok, why = self.run_program(job["code"], test, limit)
            self.clean_up()
            if ok:
                self.counts[0] += 1
                continue
            failure = failure or f"test {i} of {len(tests)}: {why}"
            if why.startswith("time limit"):
                break  # the rest would likely spend their limits too: they count as failed
        if failure:
            return False, f"{failure} ({self.counts[0]}/{len(tests)} tests passed)"
        return True, f"{len(tests)}/{len(tests)} tests passed"

    def run_program(self, code, test, limit):
        """Run the program on one test's input; (passed, what happened)."""
        out, why = self.program_output(code, test["input"], limit)
        if out is None:
            return False, why
        return compare_output(
            out,
            test["output"],
            float(self.limits.get("abs_tol") or 0),
            float(self.limits.get("rel_tol") or 0),
        )

    def program_output(self, code, text, limit):
        """The program's output on one input, or (None, why it has none)."""
        pid, sock, errs = self.starter.spawn("stdio", self.limits)
        start = time.monotonic()
        try:
            send_msg(sock, {"code": code})
            out, err, what = pump(sock, errs, text.encode(), self.cap, start + limit)
        finally:
            sock.close()
            errs.close()
        status = self.finish(pid) if what else self.wait_exit(pid, start + limit)
        if what == "timeout" or status == "timeout":
            return None, f"time limit exceeded ({limit:g} s)"
        if what == "output":
            return None, f"output limit exceeded (over {self.cap} bytes)"
        failed = runtime_error(status, err)
        if failed:
            return None, failed
        return out.decode("utf-8", "replace"), ""

    # -- a tool call: the code's output, whatever it is, goes back to the model --------

    def run_tool(self, job, deadline):
        """Run the code as a program with no input; its stdout, stderr tail and error."""
        limit = deadline_left(deadline)
        pid, sock, errs = self.starter.spawn("stdio", self.limits)
        start = time.monotonic()
        try:
            send_msg(sock, {"code": job["code"]})
            out, err, what = pump(sock, errs, b"", self.cap, start + limit)
        finally:
            sock.close()
            errs.close()
        status = self.finish(pid) if what else self.wait_exit(pid, start + limit)
        if what == "timeout" or status == "timeout":
            why = f"time limit exceeded ({limit:g} s)"
        elif what == "output":
            why = f"output limit exceeded (over {self.cap} bytes)"
        else:
            why = runtime_error(status, err)
        self.values = [
            {
                "stdout": out.decode("utf-8", "replace"),
                "stderr": err.decode("utf-8", "replace"),
                "error": why,
            }
        ]
        return not why, why or "ran"

    # -- probes: what trusted code gives on new inputs ---------------------------------

    def run_probe(self, job, deadline):
        """The reference's value on each input: {"ok": value} or {"error": why} each.

        Function inputs are argument lists, called in one process until one times out or
        stops it (then a new one takes the rest); program inputs are stdin texts."""
        per_test = self.per_test()
        inputs, self.values = job["tests"]["inputs"], []
        if job["entry_point"] is None:
            for text in inputs:
                limit = min(per_test, deadline_left(deadline))
                if limit <= 0:
                    self.values.append({"error": "not run: the probe's time ran out"})
                    continue
                out, why = self.program_output(job["code"], text, limit)
                self.clean_up()
                self.values.append({"ok": out} if out is not None else {"error": why})
            return True, f"{len(inputs)} inputs run"
        while len(self.values) < len(inputs):
            if deadline_left(deadline) <= 0:
                self.values.append({"error": "not run: the probe's time ran out"})
                continue
            self.probe_calls(job, inputs[len(self.values) :], deadline, per_test)
        return True, f"{len(inputs)} inputs run"

    def probe_calls(self, job, inputs, deadline, per_test):
        """Call the entry point on inputs in one process until one stops it."""
        pid, sock, _ = self.starter.spawn("calls", self.limits)
        conn, first = Conn(sock, self.cap, deadline), len(self.values)
        try:
            send_msg(sock, {"code": job["code"]})
            ns = self.namespace(job, conn, conn.ready())
            fn = ns[job["entry_point"]]
            for args in inputs:
                try:
                    self.arm(min(per_test, deadline_left(deadline)))
                    value = fn(*decode(args))
                    self.disarm()
                    self.values.append({"ok": encode(value)})
                except Timeout:
                    self.disarm()
                    self.values.append({"error": f"timed out after {per_test:g} s"})
                    return
                except Stop as e:
                    self.disarm()
                    self.values.append({"error": e.reason})
                    return
                except Exception as e:
                    self.disarm()
                    self.values.append({"error": _describe(e)})
        except Stop as e:  # the code did not load: no input of this process gets a value
            self.values += [{"error": e.reason}] * (len(inputs) - (len(self.values) - first))
        finally:
            self.disarm()
            sock.close()
            self.finish(pid)

    def wait_exit(self, pid, deadline):
        left = deadline_left(deadline)
        reply = self.starter._read(left)
        if reply and "exit" in reply:
            return reply["exit"]
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        self.starter.exit_status(5)
        return "timeout"


class Conn:
    """The referee's end of one candidate process running function tests."""

    def __init__(self, sock, cap, deadline):
        self.sock, self.cap, self.deadline = sock, cap, deadline
        self.calls = self.asserts = 0
        self.stop = ""
        self.last = None

    def count_assert(self):
        self.asserts += 1

    def stopped(self, reason):
        """Stop this job for good (test code cannot catch it away); the exception to raise."""
        self.stop = self.stop or reason
        return Stop(self.stop)

    def receive(self):
        try:
            return recv_msg(self.sock, self.cap, self.deadline)
        except Gone:
            raise self.stopped("the code exited or was killed before the tests finished") from None
        except OverflowError as e:
            raise self.stopped(f"output limit exceeded: {e}") from None
        except (ValueError, RecursionError):
            raise self.stopped("the candidate's process sent a malformed message") from None

    def ready(self):
        msg = self.receive()
        if type(msg) is dict and "load_error" in msg:
            raise self.stopped(f"the code {str(msg['load_error'])[:300]}")
        names = msg.get("ready") if type(msg) is dict else None
        if type(names) is not list or not all(type(n) is str for n in names):
            raise self.stopped("the candidate's process sent a malformed message")
        return names

    def proxy(self, name):
        def call(*args, **kwargs):
            return self.call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def call(self, name, args, kwargs):
        if self.stop:
            raise Stop(self.stop)
        try:
            request = {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
            request["id"] = self.calls + 1
        except NotPlain as e:
            raise self.stopped(
                f"the tests pass {e} to {name}(): only plain values cross to the candidate "
                "(use isolation: shared for such tests)"
            ) from None
        try:
            send_msg(self.sock, request)
        except OSError:
            raise self.stopped("the code exited or was killed before the tests finished") from None
        msg = self.receive()
        self.calls += 1
        shown = f"{name}({', '.join(short(a, 40) for a in args)})"
        if type(msg) is not dict or len(msg) != 2 or msg.pop("id", None) != self.calls:
            raise self.stopped("the candidate's process sent a malformed message")
        ((kind, body),) = msg.items()
        if kind == "ok":
            try:
                value = decode(body)
            except (NotPlain, RecursionError):
                raise self.stopped(f"{shown} sent a malformed value") from None
            self.last = f"{shown} returned {short(value)}"
            return value
        if kind == "refused":
            raise self.stopped(
                f"{shown} returned {str(body)[:100]}: only plain values (numbers, strings, "
                "bytes, None, booleans, tuples, lists, dicts, sets) cross to the referee"
            )
        if kind == "exit":
            raise self.stopped(f"{shown} tried to exit ({str(body)[:40]})")
        if kind == "raised" and type(body) is list and len(body) == 2:
            self.last = f"{shown} raised {str(body[0])[:60]}"
            raise candidate_exception(str(body[0]), str(body[1]))
        raise self.stopped("the candidate's process sent a malformed message")


class CandidateError(Exception):
    """An exception the candidate raised, of a type the referee does not know."""


def candidate_exception(name: str, message: str) -> Exception:
    """The candidate's exception as the referee sees it: a built-in type, or CandidateError."""
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            return cls(message[:300])
        except Exception:
            pass
    return CandidateError(f"{name[:60]}: {message[:300]}")


def deadline_left(deadline: float) -> float:
    return deadline - time.monotonic()


def pump(
    sock: socket.socket, errs: socket.socket, data: bytes, cap: int, deadline: float
) -> tuple[bytes, bytes, str]:
    """Feed a program its input and collect its output: (stdout, stderr tail, problem)."""
    sock.setblocking(False)
    errs.setblocking(False)
    out, err, sent = bytearray(), bytearray(), 0
    reading = [sock, errs]
    if not data:
        sock.shutdown(socket.SHUT_WR)
    while reading:
        left = deadline_left(deadline)
        if left <= 0:
            return bytes(out), bytes(err), "timeout"
        writing = [sock] if sent < len(data) else []
        r, w, _ = select.select(reading, writing, [], left)
        if w:
            try:
                sent += sock.send(data[sent : sent + 65536])
            except BlockingIOError:
                pass
            except OSError:
                sent = len(data)  # the program closed its input: it reads no more
            if sent >= len(data):
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        for s in r:
            try:
                chunk = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                reading.remove(s)
            elif s is sock:
                out += chunk
                if len(out) > cap:
                    return bytes(out[:cap]), bytes(err), "output"
            else:
                err = (err + chunk)[-2048:]
    return bytes(out), bytes(err), ""


def runtime_error(status: int | None, err: bytes) -> str:
    """Why the program's exit counts as a runtime error, or '' for a clean exit."""
    tail = err.decode("utf-8", "replace").strip().splitlines()
    last = tail[-1][:200] if tail else ""
    if status is None:
        return "runtime error: the sandbox lost the program's exit status"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return "time limit exceeded (CPU time)"
        name = {9: "SIGKILL"}.get(sig, str(sig))
        return f"runtime error: killed by signal {sig} ({name})"
    code = os.WEXITSTATUS(status)
    if code:
        return f"runtime error (exit code {code})" + (f": {last}" if last else "")
    return ""


_NUMBER = None


def _as_float(token):
    global _NUMBER
    if _NUMBER is None:
        import re

        _NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
    return float(token) if _NUMBER.fullmatch(token) else None


def compare_output(
    got: str, want: str, abs_tol: float = 0.0, rel_tol: float = 0.0
) -> tuple[bool, str]:
    """Compare by line and token, ignoring blank lines and spacing; floats within tolerance."""
    import math

    g = [line.split() for line in got.splitlines() if line.strip()]
    w = [line.split() for line in want.splitlines() if line.strip()]
    for n, (gl, wl) in enumerate(zip(g, w, strict=False), 1):
        for a, b in zip(gl, wl, strict=False):
            if a == b:
                continue
            x, y = _as_float(a), _as_float(b)
            if (abs_tol or rel_tol) and x is not None and y is not None:
                if math.isclose(x, y, rel_tol=rel_tol, abs_tol=abs_tol):
                    continue
            return False, f"wrong answer on line {n}: expected {short(b, 60)}, got {short(a, 60)}"
        if len(gl) != len(wl):
            return False, (
                f"wrong answer on line {n}: expected {len(wl)} tokens, got {len(gl)} "
                f"({short(' '.join(gl), 60)})"
            )
    if len(g) != len(w):
        return False, f"wrong answer: expected {len(w)} lines of output, got {len(g)}"
    return True, ""


def reap() -> None:
    """Collect exited children (as the namespace's init, the referee inherits orphans)."""
    while True:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not got:
            return


def referee_main() -> None:
    not_dumpable()
    payload = json.loads(sys.stdin.read())
    sys.stdin.close()
    referee = Referee(payload["source"], payload["limits"])
    for job in payload["jobs"]:
        sys.stdout.write(json.dumps(referee.run(job)) + "\n")
        sys.stdout.flush()


def main() -> None:
    if sys.argv[1:2] == ["starter"]:
        starter_main(int(sys.argv[2]))
    else:
        referee_main()


if __name__ == "__main__":
    main()
