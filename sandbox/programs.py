"""How the referee runs a program: feeding its input, collecting its output, reading its
exit status and comparing what it printed (stdlib only: part of the harness script)."""

from __future__ import annotations

import os
import select
import signal
import socket

from thresher.sandbox.protocol import deadline_left, short


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
