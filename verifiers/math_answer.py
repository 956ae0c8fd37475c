"""The `math` verifier: the final answer is mathematically equivalent to the reference.

Answers are found and compared the way math-verify does (LaTeX spans, intervals, sets,
tuples, matrices, relations, several answers), then held to the hedge rule. Two plain
numbers are compared here as decimals; everything that needs sympy runs in worker
processes (`math_workers`) that are killed at the per-candidate deadline.
"""

from __future__ import annotations

import ast
import itertools
import operator
import re
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache

import polars as pl
from pydantic import Field, field_validator

from thresher.verifiers import math_workers
from thresher.verifiers.base import Verdict, Verifier, quote, verdict_frame
from thresher.verifiers.extract import (
    NUMBER,
    final_answers,
    latex_spans,
    marked_answers,
    mask_math,
)

_TEXT_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{[a-zA-Z ]+\}")
_TEXT_ANY = re.compile(r"\\(?:text\w*|mbox|mathrm|operatorname)\{[^{}]*\}")
_DOLLAR_AMOUNT = re.compile(r"^\\?\$\s*(?=\d)")
_HEDGE_SPLIT = re.compile(r",\s+|;|\bor\b|\band\b")
# words that make an "answer is ..." line prose rather than one expression
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_MATH_WORDS = frozenset(
    "and sin cos tan cot sec csc log exp sqrt arcsin arccos arctan sinh cosh tanh "
    "mod pmod gcd lcm max min inf lim det deg".split()
)
# an answer in words ("Evelyn", "odd", "no solution"): compared as text, not as a product
# of one-letter variables
_WORDS = re.compile(r"[A-Za-z]{2,}(?:[ '\-][A-Za-z]+)*")
_NOT_WORDS = frozenset("pi oo inf infty infinity".split()) | _MATH_WORDS
_PLAIN = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
# a number or a plain arithmetic expression in prose, as math-verify's expression extraction
# reads them: "1 000", "1,000.5", "2,74" (decimal comma), "28 %", "2/3"; expressions are
# bounded in length so that a scan stays linear in the text
_OPS = r"+\-*×/^()÷"
_EXPR = rf"-?\(?-?\d[\d.\s{_OPS}]{{0,30}}[{_OPS}][\d.\s{_OPS}]{{1,30}}(?=(?:\*\*)?(?:[.,:\s)$]|$))"
_NUM = r"-?(?:[1-9]\d{0,2}(?:[ ,]\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)"
_PERCENT = r"(?:\s*(?:%|[Pp]ercent(?:age)?|[Pp]ct))?"
_BEFORE = r"(?:(?<=\s)|(?<==)|(?<=\*\*)|^)[$€£¥₹]?"
_PROSE_VALUE = re.compile(rf"{_BEFORE}({_EXPR}|{_NUM}{_PERCENT})")
_PROSE_NUMBER = re.compile(rf"{_BEFORE}({_NUM}{_PERCENT})")
_TAIL = 2000
# arithmetic on plain numbers with a sum, difference or product left to do ("93 - 76",
# "3 * -2"): the question restated, not its value; a fraction or a power is a value's form
_PLAIN_ARITHMETIC = re.compile(r"[\d.,()+\-*×÷/^]+")
_OPERATION = re.compile(r"[\d)][+\-*×÷]")
# a whole-number quotient written as a division ("6 / 3" for 2): the division left undone
_DIVISION = re.compile(r"\(?(-?\d+)\)?/\(?(-?\d+)\)?")
_PARENS = re.compile(r"\((-?[\d.,]+)\)")


@dataclass(frozen=True)
class Answer:
    """One final answer and how to read it: `expr` is one expression (a box's content),
    `text` a line of prose whose rightmost LaTeX or number counts, `latex` a whole
    completion whose last LaTeX span counts, `number` a number or expression from prose."""

    text: str
    kind: str  # "expr" | "text" | "latex" | "number"


def clean_answer(answer: str) -> str:
    """An answer without surrounding spaces, a trailing dot, a currency $ or $ delimiters."""
    a = answer.strip().rstrip(".").strip()
    a = _DOLLAR_AMOUNT.sub("", a)  # "$12" (money), not a LaTeX delimiter
    return a.strip("$ ").strip()


def _plain_number(text: str, decimal_comma: bool = False) -> Decimal | None:
    """The value of a plain decimal number ("1,234", "-0.5"); None for anything else.

    With `decimal_comma` (numbers in prose, as math-verify reads them) "2,74" is 2.74 and
    "1 000" is 1000; in LaTeX "2,74" is two numbers.
    """
    t = text.strip()
    if decimal_comma and re.fullmatch(r"-?[1-9]\d{0,2}(?: \d{3})+(?:\.\d+)?", t):
        t = t.replace(" ", "")
    if _THOUSANDS.fullmatch(t):
        t = t.replace(",", "")
    elif decimal_comma and re.fullmatch(r"-?\d+,\d+", t):
        t = t.replace(",", ".")
    if not _PLAIN.fullmatch(t):
        return None
    try:
        return Decimal(t)
    except InvalidOperation:
        return None


def _is_prose(text: str) -> bool:
    words = _WORD.findall(_TEXT_ANY.sub(" ", text))
    return any(w.lower() not in _MATH_WORDS for w in words)


def _is_words(text: str) -> bool:
    t = text.strip()
    return bool(_WORDS.fullmatch(t)) and t.lower() not in _NOT_WORDS


def _fragment(text: str) -> Answer:
    """An answer written after "the answer is" or inside <answer> tags."""
    inner = text.strip()
    if latex_spans(inner, bare_fractions=False) or (_is_prose(inner) and not _is_words(inner)):
        return Answer(inner, "text")
    return Answer(clean_answer(inner), "expr")


def math_answers(text: str, pattern: str | None = None) -> tuple[list[Answer], str]:
    """The final answers of a completion and how they were found.

    Explicit markers first (pattern, \\boxed{}, ####, <answer>, "the answer is" /
    "Final Answer:"), else the last LaTeX span or the last number in the prose, whichever
    comes later.
    """
    found, how = marked_answers(text, pattern)
    if how in ("<answer>", "'answer is'"):
        return [_fragment(f) for f in found], how
    if found:
        return [Answer(f, "expr") for f in found], how
    prose, span_end = mask_math(text)
    number = _last_prose_value(prose)
    if number and number.end() > span_end:  # whichever comes last, as math-verify
        return [Answer(_whole_value(prose, number), "number")], "last number"
    if span_end >= 0:
        return [Answer(text, "latex")], "latex"
    return [], "nothing"


def _last_prose_value(prose: str) -> re.Match | None:
    """The last number or plain expression; expressions only near the end (for speed)."""
    found = list(_PROSE_VALUE.finditer(prose, max(0, len(prose) - _TAIL)))
    if not found:
        found = list(_PROSE_NUMBER.finditer(prose))
    return found[-1] if found else None


def _whole_value(prose: str, number: re.Match) -> str:
    """The value found, or the rest of its line when it is the start of a longer expression
    than the scan reads (math-verify then reads the expression)."""
    end = number.end()
    if end < len(prose) and prose[end] in "+-*×/^÷(":
        line_end = prose.find("\n", end)
        return prose[number.start(1) : line_end if line_end >= 0 else len(prose)].strip()
    return number.group(1).strip()


def _several(answer: str) -> bool:
    """A list of numbers ("2, 3, 4", "2 or 3"): a hedge where one number is expected."""
    parts = _HEDGE_SPLIT.split(_TEXT_UNIT.sub("", answer))
    return sum(1 for p in parts if NUMBER.search(p)) > 1


def unevaluated(answer: Answer) -> bool:
    """Plain-number arithmetic with an operation left to do, where a value is expected: a
    sum, difference or product, or a division whose quotient is a whole number."""
    if answer.kind not in ("number", "expr"):
        return False
    t = re.sub(r"\s+", "", clean_answer(answer.text)).rstrip("=≈")
    if not _PLAIN_ARITHMETIC.fullmatch(t):
        return False
    if _OPERATION.search(t):
        return True
    while t[:1] in "-+" and t[1:2] == "(" or t[:1] == "(" and t.endswith(")"):
        t = t[2:-1] if t[:1] in "-+" else t[1:-1]  # "-(95 / 19)" is 95 / 19 undone
    division = _DIVISION.fullmatch(t)
    if division:
        top, bottom = int(division.group(1)), int(division.group(2))
        return bottom != 0 and top % bottom == 0
    return False


def _arithmetic_value(text: str) -> Fraction | None:
    """The exact value of a plain number or of plain-number arithmetic, else None."""
    t = text.strip()
    plain = _plain_number(t)
    if plain is not None:
        return Fraction(plain)
    if len(t) > 80 or "," in t or not _PLAIN_ARITHMETIC.fullmatch(re.sub(r"\s+", "", t)):
        return None
    t = t.replace("×", "*").replace("÷", "/").replace("^", "**")
    try:
        return _evaluate(ast.parse(t, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](left, right)
        if isinstance(node.op, ast.Div):
            return left / right
        if isinstance(node.op, ast.Pow) and right.denominator == 1 and abs(right) <= 64:
            return left ** int(right)
    raise ValueError("not plain arithmetic")


def false_equation(answer: Answer) -> str:
    """Why an answer is an equation of plain numbers whose sides differ ("1 = 2",
    "9071 + 2783 = 3124"), or '' when it is not one."""
    if answer.kind not in ("number", "expr") or "=" not in answer.text:
        return ""
    sides = clean_answer(answer.text).split("=")
    values = [_arithmetic_value(side) for side in sides]
    known = [(side.strip(), v) for side, v in zip(sides, values, strict=True) if v is not None]
    for (a, x), (b, y) in itertools.pairwise(known):
        if x != y:
            return f"{quote(a)} is not {quote(b)}"
    return ""


def plain_value(answer: Answer) -> Decimal | None:
    """The value of an answer that is a plain number ("(1)" too), else None."""
    text = clean_answer(answer.text)
    inner = _PARENS.fullmatch(text)
    if inner:
        text = inner.group(1)
    if answer.kind == "number":
        return _plain_number(text, decimal_comma=True)
    if answer.kind == "expr":
        return _plain_number(text)
    return None


def quick_verdict(text: str, reference: str | None, pattern: str | None = None) -> Verdict | None:
    """The verdict when no sympy is needed (no answer, plain numbers, plain hedges), else None."""
    if reference is None or not str(reference).strip():
        return Verdict(0.0, False, "no reference answer for this prompt")
    answers, how = math_answers(text, pattern)
    if not answers:
        return Verdict(0.0, False, "no final answer found")
    want = _plain_number(clean_answer(str(reference)), decimal_comma=True)
    if want is None:
        return None
    listed = [
        a.text for a in answers if a.kind in ("expr", "text") and _several(clean_answer(a.text))
    ]
    if listed:
        return Verdict(0.0, False, f"hedged: several values in {quote(listed[0])} ({how})")
    false = [(a.text, why) for a in answers if (why := false_equation(a))]
    if false:
        shown = quote(clean_answer(false[-1][0]))
        return Verdict(0.0, False, f"{how}: {shown} is a false equation ({false[-1][1]})")
    left = [a.text for a in answers if unevaluated(a)]
    if left:
        shown = quote(clean_answer(left[-1]))
        return Verdict(0.0, False, f"{how}: {shown} is arithmetic left undone, not a value")
    values = [plain_value(a) for a in answers]
    if any(v is None for v in values):
        return None
    if len(set(values)) > 1:
        return Verdict(0.0, False, f"hedged: {len(set(values))} different final answers ({how})")
    shown = clean_answer(answers[-1].text)
    if values[0] == want:
        return Verdict(1.0, True, f"{how}: {quote(shown)} equals {quote(reference)}")
    return Verdict(0.0, False, f"{how}: {quote(shown)} is not {quote(reference)}")


# --- the sympy side: runs in the worker processes -------------------------------------------


@lru_cache(maxsize=1)
def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    latex, expr = LatexExtractionConfig(), ExprExtractionConfig()
    return {"latex": [latex], "expr": [expr], "both": [latex, expr]}


def _mv_parse(text: str, which: str) -> list:
    from math_verify import parse

    # the worker process enforces the deadline: math-verify's signal alarm stays off
    return parse(text, _configs()[which], parsing_timeout=None)


def _has_value(parsed: list) -> bool:
    return any(not isinstance(p, str) for p in parsed)


@lru_cache(maxsize=4096)
def parse_answer(answer: Answer) -> tuple:
    """math-verify's reading of one answer: (sympy value, its LaTeX) or fallbacks."""
    if answer.kind == "number":
        return tuple(_mv_parse(answer.text, "expr"))
    if answer.kind == "text":
        return tuple(_mv_parse(answer.text, "both"))
    if answer.kind == "latex":
        return tuple(_mv_parse(answer.text, "latex"))
    if _is_words(answer.text):
        return tuple(_mv_parse("\\boxed{\\text{" + answer.text + "}}", "latex"))
    parsed = _mv_parse("\\boxed{" + answer.text + "}", "latex")  # one whole expression
    if _has_value(parsed):
        return tuple(parsed)
    return tuple(_mv_parse(answer.text, "both")) or tuple(parsed)


@lru_cache(maxsize=4096)
def parse_reference(reference: str) -> tuple:
    """math-verify's reading of a reference answer (a bare one is one expression)."""
    ref = reference.strip()
    if _plain_number(ref, decimal_comma=True) is not None:
        return tuple(_mv_parse(ref, "expr"))
    if "\\boxed" in ref or "\\fbox" in ref or latex_spans(ref, bare_fractions=False):
        return tuple(_mv_parse(ref, "both"))
    found, how = marked_answers(ref)
    if found:
        answer = _fragment(found[-1]) if how in ("<answer>", "'answer is'") else None
        return parse_answer(answer or Answer(found[-1], "expr"))
    return parse_answer(Answer(ref, "expr"))


def _value(parsed: tuple):
    return next((p for p in parsed if not isinstance(p, str)), None)


def _shown(parsed: tuple, fallback: str = "") -> str:
    """The LaTeX math-verify extracted, else `fallback`."""
    text = next((p for p in reversed(parsed) if isinstance(p, str)), None)
    return text or fallback


def _equal(gold: tuple, pred: tuple) -> bool:
    from math_verify import verify

    return bool(gold and pred and verify(list(gold), list(pred), timeout_seconds=None))


def _answer_part(value):
    """The value an assignment (`x = ...`) gives, else the value itself."""
    from sympy import Eq

    return value.rhs if isinstance(value, Eq) else value


def _single_valued(value) -> bool:
    """One value expected: not a set, tuple, interval or matrix (which compare as such)."""
    from sympy import MatrixBase, Set, Tuple
    from sympy.matrices.expressions import MatrixExpr

    structured = Set | Tuple | MatrixBase | MatrixExpr
    return value is not None and not isinstance(_answer_part(value), structured)


def _is_several(value) -> bool:
    from sympy import FiniteSet

    part = _answer_part(value)
    return isinstance(part, FiniteSet) and len(part) > 1


def _union(parsed: list[tuple]) -> tuple:
    """Several answers (one box each) read as one set of answers."""
    from latex2sympy2_extended.sets import FiniteSet

    values = [_value(p) for p in parsed]
    text = ", ".join(_shown(p) for p in parsed)
    if any(v is None for v in values):
        return (text,)
    elements = [e for v in values for e in (v.args if isinstance(v, FiniteSet) else (v,))]
    return (FiniteSet(*elements), text)


def _distinct(parsed: list[tuple]) -> list[tuple]:
    """The answers that differ from every earlier one (repeating an answer is no hedge)."""
    kept: list[tuple] = []
    for p in parsed:
        if not any(p == k or _equal(k, p) for k in kept):
            kept.append(p)
    return kept


def _hedge(gold_value, answers: list[Answer], parsed: list[tuple], how: str) -> Verdict | None:
    """A failing verdict when the answer commits to several values where one is expected."""
    if len(parsed) > 1 and not _is_several(gold_value):
        return Verdict(0.0, False, f"hedged: {len(parsed)} different final answers ({how})")
    if not _single_valued(gold_value) or len(parsed) > 1:
        return None
    shown = _shown(parsed[0], answers[-1].text)
    listed = getattr(gold_value, "is_number", False) and _several(clean_answer(shown))
    if _is_several(_value(parsed[0])) or listed:
        return Verdict(0.0, False, f"hedged: several values in {quote(shown)} ({how})")
    return None


def check_full(text: str, reference: str | None, pattern: str | None = None) -> Verdict:
    """The verdict, with sympy where needed (no timeout here: the caller provides it)."""
    quick = quick_verdict(text, reference, pattern)
    if quick is not None:
        return quick
    gold = parse_reference(str(reference))
    if not gold:
        return Verdict(0.0, False, f"could not parse the reference {quote(reference)}")
    answers, how = math_answers(text, pattern)
    parsed = _distinct([parse_answer(a) for a in answers])
    hedge = _hedge(_value(gold), answers, parsed, how)
    if hedge is not None:
        return hedge
    pred = _union(parsed) if len(parsed) > 1 else parsed[0]
    if not pred:
        return Verdict(0.0, False, f"{how}: could not parse {quote(answers[-1].text)}")
    shown = _shown(pred, answers[-1].text)
    if _equal(gold, pred):
        return Verdict(1.0, True, f"{how}: {quote(shown)} equals {quote(reference)}")
    return Verdict(0.0, False, f"{how}: {quote(shown)} is not {quote(reference)}")


class MathAnswer(Verifier):
    """Extract the final answer and check equivalence the way math-verify does, then the
    hedge rule; sympy work runs in worker processes killed after `timeout_s` per candidate.

    Options: `pattern` (a regex whose group 1 is the answer), `timeout_s` (per candidate).
    """

    name = "math"
    uses_reference = True
    # 2: several different "the answer is" statements are a hedge; 3: plain-number arithmetic
    # left undone ("93 - 76 =") is not the value it would have; 4: "X is the final answer"
    # reads X, a false equation of plain numbers ("1 = 2") fails, a whole-number division
    # left undone ("6 / 3") is not a value, "(1)" reads 1
    version = 4

    class Options(Verifier.Options):
        pattern: str | None = Field(None, description="a regex whose group 1 is the answer")
        timeout_s: float = Field(5, gt=0, description="per candidate (a hard limit)")

        @field_validator("pattern")
        @classmethod
        def _compiles(cls, pattern: str | None) -> str | None:
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"not a valid regex: {e}") from None
            return pattern

    def __init__(self, pattern: str | None = None, timeout_s: float = 5):
        self.pattern = pattern
        self.timeout_s = timeout_s

    def check(self, text: str, reference: str | None) -> Verdict:
        """The verdict on one completion."""
        return self._check_many([(text, reference)])[0][0]

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, answer)."""
        pairs = list(zip(batch["text"].to_list(), batch["answer"].to_list(), strict=True))
        results = self._check_many(pairs)
        verdicts = [v for v, _ in results]
        elapsed = [ms for _, ms in results]
        answers = [_last(final_answers(text or "", self.pattern)[0]) for text, _ in pairs]
        ids = batch["candidate_id"].to_list()
        return verdict_frame(self.name, ids, verdicts, elapsed, answers)

    def _check_many(self, pairs: list[tuple[str, str | None]]) -> list[tuple[Verdict, float]]:
        """(verdict, elapsed ms) per (text, reference): plain numbers here, the rest in workers."""
        results: list[tuple[Verdict, float] | None] = []
        slow = []
        for i, (text, reference) in enumerate(pairs):
            start = time.perf_counter()
            verdict = quick_verdict(text or "", reference, self.pattern)
            results.append(None if verdict is None else (verdict, _ms_since(start)))
            if verdict is None:
                slow.append(i)
        if slow:
            jobs = [(pairs[i][0] or "", str(pairs[i][1]), self.pattern) for i in slow]
            checked = math_workers.check_in_workers(jobs, self.timeout_s)
            for i, result in zip(slow, checked, strict=True):
                results[i] = result
        return results  # type: ignore[return-value]


def _last(answers: list[str]) -> str | None:
    return answers[-1] if answers else None


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
