"""Selection rules such as "math and format", turned into SQL over a candidate's verdicts."""

from __future__ import annotations

import ast

ALL_PASSED = "count(v.verifier) > 0 AND coalesce(bool_and(v.passed), false)"


class RuleError(ValueError):
    """A rule that is not a boolean expression over verifier names."""


def rule_names(rule: str) -> set[str]:
    """The verifier names a rule uses; raises RuleError when it is malformed."""
    return {n.id for n in ast.walk(_parse(rule)) if isinstance(n, ast.Name)}


def rule_sql(rule: str | None) -> str:
    """A SQL aggregate over verdicts `v` of one candidate: true when the rule holds.

    No rule: every verifier that scored the candidate passed it (and at least one did).
    A verifier named in the rule that did not score the candidate counts as failed.
    """
    if not rule:
        return ALL_PASSED
    return _to_sql(_parse(rule).body)


def _parse(rule: str) -> ast.Expression:
    try:
        tree = ast.parse(rule.strip(), mode="eval")
    except SyntaxError:
        raise RuleError(f"rule {rule!r} is not a boolean expression of verifier names") from None
    for node in ast.walk(tree):
        if not isinstance(
            node,
            ast.Expression
            | ast.BoolOp
            | ast.And
            | ast.Or
            | ast.UnaryOp
            | ast.Not
            | ast.Name
            | ast.Load,
        ):
            raise RuleError(
                f"rule {rule!r}: only verifier names, and, or, not and parentheses are allowed"
            )
    return tree


def _to_sql(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        name = node.id.replace("'", "''")
        return f"coalesce(bool_and(v.passed) FILTER (WHERE v.verifier = '{name}'), false)"
    if isinstance(node, ast.UnaryOp):
        return f"(NOT {_to_sql(node.operand)})"
    op = " AND " if isinstance(node.op, ast.And) else " OR "
    return "(" + op.join(_to_sql(v) for v in node.values) + ")"
