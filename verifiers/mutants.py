"""Mutants of a reference solution, and new inputs made by mutating the tests' own inputs.

Both are mechanical and seeded, so a prompt gets the same mutants and inputs on every run.
Nothing here runs code: the judge (`sandbox.run_jobs`) does.
"""

from __future__ import annotations

import ast
import copy
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

_SWAP_BIN = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
# boundaries move by one (< and <=), equalities flip
SWAP_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SWAP_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
MAX_INPUT_CHARS = 2000  # a generated input's repr (or stdin text) stays this small


def _sites(root: ast.AST) -> list[tuple]:
    """(kind, node, detail) of every place one mechanical mutation changes the code."""
    sites: list[tuple] = []
    for node in ast.walk(root):
        if isinstance(node, ast.BinOp) and type(node.op) in _SWAP_BIN:
            sites.append(("operator", node, None))
        elif isinstance(node, ast.Compare):
            sites += [
                ("comparison", node, i) for i, op in enumerate(node.ops) if type(op) in SWAP_CMP
            ]
        elif isinstance(node, ast.BoolOp):
            sites.append(("and/or", node, None))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites += [("constant + 1", node, 1), ("constant - 1", node, -1)]
        elif isinstance(node, ast.If | ast.While | ast.IfExp):
            sites.append(("negated condition", node, None))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            sites.append(("swapped arguments", node, None))
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if isinstance(body, list) and len(body) > 1:
                sites += [
                    ("dropped statement", node, (field, i))
                    for i, stmt in enumerate(body)
                    if not _inert(stmt)
                ]
    return sites


def _inert(stmt: ast.stmt) -> bool:
    """A docstring, a bare constant or `pass`: dropping it changes nothing."""
    return isinstance(stmt, ast.Pass) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    )


def _apply(kind: str, node: ast.AST, detail) -> None:
    if kind == "operator":
        node.op = _SWAP_BIN[type(node.op)]()
    elif kind == "comparison":
        node.ops[detail] = SWAP_CMP[type(node.ops[detail])]()
    elif kind == "and/or":
        node.op = SWAP_BOOL[type(node.op)]()
    elif kind.startswith("constant"):
        node.value += detail
    elif kind == "negated condition":
        node.test = ast.UnaryOp(ast.Not(), node.test)
    elif kind == "swapped arguments":
        node.args[0], node.args[1] = node.args[1], node.args[0]
    else:  # dropped statement
        field, i = detail
        getattr(node, field)[i] = ast.Pass()


def _target(tree: ast.Module, entry: str | None) -> ast.AST | None:
    """What to mutate: the entry function (its last definition), else the whole program."""
    if entry is None:
        return tree
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    return fns[-1] if fns else None


def make_mutants(code: str, entry: str | None, n: int, seed: str) -> list[tuple[str, str]]:
    """Up to `n` distinct (kind, code) mutants of `code` (its `entry` function, else all of
    it), sampled with `seed`; [] when the code does not parse or has nothing to mutate."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    target = _target(tree, entry)
    if target is None:
        return []
    count = len(_sites(target))
    original = ast.unparse(tree)
    order = list(range(count))
    random.Random(seed).shuffle(order)
    out, seen = [], {original}
    for k in order:
        if len(out) >= n:
            break
        mutant = copy.deepcopy(tree)
        kind, node, detail = _sites(_target(mutant, entry))[k]
        _apply(kind, node, detail)
        text = ast.unparse(ast.fix_missing_locations(mutant))
        if text not in seen:
            seen.add(text)
            out.append((kind, text + "\n"))
    return out


def named_calls(tests: str | list) -> Iterator[ast.Call]:
    """Every call of a plain name (`f(...)`) in the tests (test code or a list of test
    statements), in order; a test that does not parse has none."""
    for source in tests if isinstance(tests, list) else [tests]:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                yield node


def call_inputs(tests: str | list, entry: str) -> list[list]:
    """The argument lists the tests call `entry` (or `candidate`) with, where every
    argument is a literal; in the order the tests make the calls."""
    out, seen = [], set()
    for node in named_calls(tests):
        if node.func.id not in (entry, "candidate") or node.keywords:
            continue
        try:
            args = [ast.literal_eval(a) for a in node.args]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        key = repr(args)
        if key not in seen:
            seen.add(key)
            out.append(args)
    return out


def _variants(value) -> list:
    """Type-aware neighbours of one value (as EvalPlus mutates inputs)."""
    t = type(value)
    if t is bool:
        return [not value]
    if t is int:
        return [value + 1, value - 1, -value, 0, 1, -1, value * 2, value * 10]
    if t is float:
        return [value * 2, -value, value + 0.5, 0.0]
    if t is str:
        out = [value[::-1], value[1:], value + value[:1], "", value.upper(), value + " "]
        if len(value) > 1:
            out.append(value[1] + value[0] + value[2:])
        return out
    if t in (list, tuple):
        items = list(value)
        out = [items[::-1], items[:-1], items + items[:1], [], items[1:] + items[:1]]
        if items:
            out.append(items[-1:] + items[:-1])
            try:
                out += [sorted(items), sorted(items, reverse=True)]
            except TypeError:
                pass
            out += [[v, *items[1:]] for v in _variants(items[0])[:3]]
            out += [[*items[:-1], v] for v in _variants(items[-1])[:3]]
        return [t(o) for o in out]
    if t is dict and value:
        items = list(value.items())
        return [dict(items[1:]), dict(items[:-1])]
    return []


def _generations(seeds: list, variants: Callable[[Any], list], n: int) -> list[list]:
    """Variants of the seeds, then variants of those (up to 3 generations, or until there
    are 4n), by generation: new ones only, none larger than MAX_INPUT_CHARS."""
    known = {repr(s) for s in seeds}
    out: list[list] = []
    frontier = list(seeds)
    for _ in range(3):
        fresh = []
        for item in frontier:
            for new in variants(item):
                key = repr(new)
                if key not in known and len(key) <= MAX_INPUT_CHARS:
                    known.add(key)
                    fresh.append(new)
        if not fresh:
            break
        out.append(fresh)
        frontier = fresh
        if sum(map(len, out)) >= 4 * n:
            break
    return out


def _sample(generations: list[list], n: int, seed: str, near_first: bool) -> list:
    """n of the generated inputs, seeded: the seeds' nearest variants (the first
    generation: boundaries, one value changed) before the rest with `near_first`."""
    rng = random.Random(seed)
    if not near_first:
        pool = [x for g in generations for x in g]
        rng.shuffle(pool)
        return pool[:n]
    out = []
    for g in generations:
        g = list(g)
        rng.shuffle(g)
        out += g
    return out[:n]


def _argument_variants(args: list) -> list[list]:
    return [
        [*args[:i], v, *args[i + 1 :]] for i, value in enumerate(args) for v in _variants(value)
    ]


def mutate_inputs(seeds: list[list], n: int, seed: str, near_first: bool = True) -> list[list]:
    """Up to `n` new argument lists, one argument of a seed (or of a new list) changed at a
    time, sampled with `seed` (nearest first, unless told otherwise); none repeats another
    or a seed."""
    return _sample(_generations(seeds, _argument_variants, n), n, seed, near_first)


def _stdin_variants(text: str) -> list[str]:
    """Inputs of the same layout: one number changed, or one line of numbers reordered."""
    lines = text.split("\n")
    out = []
    for li, line in enumerate(lines):
        tokens = line.split()
        numbers = [i for i, tok in enumerate(tokens) if tok.lstrip("-").isdigit()]
        for i in numbers:
            v = int(tokens[i])
            for new in (v + 1, v - 1, v * 2, v * 10, 0 if v else 1):
                changed = [*tokens[:i], str(new), *tokens[i + 1 :]]
                out.append("\n".join([*lines[:li], " ".join(changed), *lines[li + 1 :]]))
        if len(numbers) > 1 and len(numbers) == len(tokens):
            # reversed, and rotated both ways: each end gets another value
            for order in (tokens[::-1], tokens[1:] + tokens[:1], tokens[-1:] + tokens[:-1]):
                out.append("\n".join([*lines[:li], " ".join(order), *lines[li + 1 :]]))
    return out


def mutate_stdin(seeds: list[str], n: int, seed: str, near_first: bool = True) -> list[str]:
    """Up to `n` new stdin texts in the seeds' layout, sampled as `mutate_inputs` samples."""
    return _sample(_generations(seeds, _stdin_variants, n), n, seed, near_first)


def literal(value: Any) -> str | None:
    """`value` as a Python literal that reads back equal, else None (nan, inf, objects)."""
    text = repr(value)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return text if back == value and type(back) is type(value) else None


def assert_line(call: str, args: list, expected: Any) -> str | None:
    """`assert call(args) == expected` (floats within 1e-9 relative), or None when an
    argument or the value has no literal form."""
    shown = [literal(a) for a in args]
    want = literal(expected)
    if want is None or any(a is None for a in shown):
        return None
    got = f"{call}({', '.join(shown)})"
    if type(expected) is float:
        return f"assert abs({got} - {want}) <= 1e-9 * max(1.0, abs({want}))"
    return f"assert {got} == {want}"


def extend_tests(tests: str | list, new: list, entry: str | None) -> str:
    """The original tests with `new` appended, stored as prompts store tests: assert lines
    into an assert list, {input, output} objects into a stdin/stdout list, and for test
    code with check(candidate) a check that runs the original and then the new asserts."""
    if isinstance(tests, list):
        return json.dumps([*tests, *new])
    body = "\n".join(f"    {line}" for line in new) or "    pass"
    return (
        f"{tests.rstrip()}\n\n\n_original_check = check\n\n\ndef check(candidate):\n"
        f"    _original_check(candidate)\n{body}\n"
    )
