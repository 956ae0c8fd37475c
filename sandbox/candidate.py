"""The candidate side of the harness (stdlib only): the starter and the candidate processes.

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

import builtins
import json
import os
import signal
import socket
import sys

from thresher.sandbox.protocol import (
    COUNTER,
    MAX_DEPTH,
    NotPlain,
    compile_counted,
    decode,
    describe,
    encode,
    error_text,
    has_assert,
    not_dumpable,
    recv_msg,
    send_msg,
    short,
)

TYPE_CHECKING = False  # no typing import at run time: annotations only
if TYPE_CHECKING:
    from typing import Any, NoReturn

PREIMPORT = (
    "math re itertools collections functools heapq bisect string typing fractions decimal "
    "statistics random hashlib copy operator datetime array types"
)


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
        send_msg(sock, {"load_error": f"tried to exit while loading ({describe(e)})"})
        os._exit(1)
    except BaseException as e:
        send_msg(sock, {"load_error": f"raised while loading: {describe(e)}"})
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
        return {"raised": ["TypeError", f"bad call: {describe(e)}"]}
    try:
        result = fn(*args, **kwargs)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as e:
        return {"exit": type(e).__name__}
    except BaseException as e:
        return {"raised": [type(e).__name__, error_text(e)]}
    try:
        return {"ok": encode(result)}
    except NotPlain as e:
        return {"refused": str(e)}
    except RecursionError:
        return {"refused": f"a value nested deeper than {MAX_DEPTH} levels"}


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
                    failure = failure or f"test {i} failed: {short(test, 120)}: {describe(e)}"
        else:
            total = 1
            exec(compile_counted(tests, "<tests>"), ns)
            if entry and callable(ns.get("check")):
                ns["check"](ns[entry])
            passed = 1
    except BaseException as e:
        failure = failure or describe(e)
    send_msg(sock, {"shared": [passed, total, failure, counted[0]]})
    os._exit(0)


# -- the starter -----------------------------------------------------------------------


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
