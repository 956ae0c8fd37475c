"""What the referee and the candidate processes share: plain values, framed messages,
counted assertions and error text (stdlib only: part of the harness script)."""

from __future__ import annotations

import ast
import json
import socket
import struct
import time

TYPE_CHECKING = False  # no typing import at run time: annotations only
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any

MAX_DEPTH = 100
HEADER = struct.Struct(">I")


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


# -- errors, deadlines, processes -----------------------------------------------------


def error_text(e):
    """str(e) cut to 300 characters ('?' if it cannot be had)."""
    try:
        return str(e)[:300]
    except BaseException:
        return "?"


def describe(e):
    """An exception as `Type: text`."""
    text = error_text(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def deadline_left(deadline: float) -> float:
    return deadline - time.monotonic()


def not_dumpable() -> None:
    """Forbid ptrace and /proc access to this process by others of the same user."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass
