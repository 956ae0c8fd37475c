"""Exact match of an extracted final answer against the reference answer."""

from __future__ import annotations

import re

import polars as pl

from thresher.verifiers.base import Verdict, Verifier, map_rows, quote
from thresher.verifiers.extract import extract_answer


def normalise(answer: str) -> str:
    """Lower-case, drop $ and trailing dots, collapse spaces, and write numbers canonically."""
    a = answer.strip().lower().replace("$", "")
    a = re.sub(r"\s+", " ", a).rstrip(".").strip()
    number = a.replace(",", "")
    if re.fullmatch(r"-?\d+(?:\.\d+)?", number):
        value = float(number)
        return str(int(value)) if value.is_integer() else repr(value)
    return a


def check(text: str, reference: str | None) -> Verdict:
    """Pass when the extracted answer equals the reference after normalisation."""
    if reference is None or not str(reference).strip():
        return Verdict(0.0, False, "no reference answer for this prompt")
    answer, how = extract_answer(text)
    if answer is None:
        return Verdict(0.0, False, "no answer found")
    got, want = normalise(answer), normalise(str(reference))
    if got == want:
        return Verdict(1.0, True, f"{how}: {quote(answer)} == {quote(reference)}", answer)
    return Verdict(0.0, False, f"{how}: {quote(answer)} != {quote(reference)}", answer)


class ExactMatch(Verifier):
    """The `exact` verifier: extracted final answer == reference answer."""

    name = "exact"
    uses_reference = True
    # 2: the last number without a comma after it ("6, which ..." reads 6); 3: "X is the
    # final answer" reads X
    version = 3

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row of `batch` (columns candidate_id, text, answer)."""
        return map_rows(self.name, batch, lambda row: check(row["text"], row["answer"]))
