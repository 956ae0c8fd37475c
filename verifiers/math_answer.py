"""The `math` verifier: the final answer is mathematically equivalent to the reference."""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from functools import lru_cache

import polars as pl

from thresher.verifiers.base import Verdict, map_rows
from thresher.verifiers.extract import NUMBER, final_answers

_TEXT_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*[a-zA-Z ]+\}")
_DOLLAR_AMOUNT = re.compile(r"^\\?\$\s*(?=\d)")


def _clean(answer: str) -> str:
    a = answer.strip().rstrip(".").strip()
    a = _DOLLAR_AMOUNT.sub("", a)  # "$12" (money), not a LaTeX delimiter
    return a.strip("$ ").strip()


def _as_latex(answer: str) -> str:
    return answer if answer.startswith("$") else f"${answer}$"


_PLAIN = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")


def _plain_number(text: str) -> Decimal | None:
    """The value of a plain decimal number ("1,234", "-0.5"); None for anything else."""
    t = text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", text) else text
    if not _PLAIN.fullmatch(t):
        return None
    try:
        return Decimal(t)
    except InvalidOperation:
        return None


@lru_cache(maxsize=65536)
def _parsed(latex: str, timeout: int | None):
    # k candidates share a reference and often an answer: parse each string once
    from math_verify import parse

    return parse(latex, parsing_timeout=timeout)


def _several(answer: str, reference: str) -> bool:
    """A list of numbers given where the reference is a single one."""
    if len(NUMBER.findall(reference.replace(",", ""))) != 1:
        return False
    stripped = _TEXT_UNIT.sub("", answer)
    parts = re.split(r"\s*(?:,\s+|;|\bor\b|\band\b)\s*", stripped)
    return sum(1 for p in parts if NUMBER.search(p)) > 1


class MathAnswer:
    """Extract the final answer and check equivalence with math-verify (timeout per candidate).

    Options: `pattern` (a regex whose group 1 is the answer), `timeout_s` (per candidate).
    """

    name = "math"

    def __init__(self, pattern: str | None = None, timeout_s: int = 5):
        self.pattern = pattern
        self.timeout_s = timeout_s

    def judge(self, text: str, reference: str | None) -> Verdict:
        from math_verify import verify

        if reference is None or not str(reference).strip():
            return Verdict(0.0, False, "no reference answer for this prompt")
        answers, how = final_answers(text, self.pattern)
        if not answers:
            return Verdict(0.0, False, "no final answer found")
        if len(answers) > 1:
            values = {_clean(a) for a in answers}
            if len(values) > 1:
                return Verdict(0.0, False, f"hedged: {len(values)} different final answers ({how})")
        answer = _clean(answers[-1])
        if _several(answer, str(reference)):
            return Verdict(0.0, False, f"hedged: several values in {answer!r} ({how})")
        ref = _clean(str(reference))
        a, b = _plain_number(answer), _plain_number(ref)
        if a is not None and b is not None:  # two plain numbers: exact decimal comparison
            if a == b:
                return Verdict(1.0, True, f"{how}: {answer!r} equals {reference!r}")
            return Verdict(0.0, False, f"{how}: {answer!r} is not {reference!r}")
        # a signal-based timeout needs the main thread; elsewhere the batch runs without one
        timeout = self.timeout_s if threading.current_thread() is threading.main_thread() else None
        gold = _parsed(_as_latex(ref), timeout)
        pred = _parsed(_as_latex(answer), timeout)
        if not pred:
            return Verdict(0.0, False, f"{how}: could not parse {answer!r}")
        try:
            same = verify(gold, pred, timeout_seconds=timeout)
        except Exception as e:  # math-verify raises on pathological input only when asked
            return Verdict(0.0, False, f"{how}: {answer!r}: {type(e).__name__}")
        if same:
            return Verdict(1.0, True, f"{how}: {answer!r} equals {reference!r}")
        return Verdict(0.0, False, f"{how}: {answer!r} is not {reference!r}")

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, answer)."""
        return map_rows(self.name, batch, lambda row: self.judge(row["text"], row["answer"]))
