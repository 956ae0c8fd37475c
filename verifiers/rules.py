"""Rule verifiers: multiple-choice letter, regex, and output format."""

from __future__ import annotations

import json
import re
from typing import Any

import polars as pl
from pydantic import Field, field_validator

from thresher.verifiers.base import Verdict, Verifier, map_rows, quote
from thresher.verifiers.extract import final_answers

_LETTER = re.compile(r"^\(?([A-Za-z])\)?[.:)]?$")
_LETTERS_IN = re.compile(r"(?<![A-Za-z])\(?([A-J])\)?(?![A-Za-z])")


class Choice(Verifier):
    """The `choice` verifier: the chosen letter equals the reference letter.

    The letter comes from \\boxed{}, <answer>, `####` or "the answer is (B)"; naming
    several letters is a hedge and fails.
    """

    name = "choice"
    uses_reference = True
    # 2: every "the answer is" statement counts, not only the last; 3: "X is the final
    # answer" counts too
    version = 3

    def check(self, text: str, reference: str | None) -> Verdict:
        """The verdict on one completion."""
        if not reference or not _LETTER.match(reference.strip()):
            return Verdict(0.0, False, f"reference {quote(reference)} is not a choice letter")
        want = _LETTER.match(reference.strip()).group(1).upper()
        answers, how = final_answers(text)
        if not answers or how == "last number":
            return Verdict(0.0, False, "no chosen letter found")
        letters = set()
        for a in answers:
            whole = _LETTER.match(a.strip())  # a lone letter, either case
            letters |= {whole.group(1).upper()} if whole else set(_LETTERS_IN.findall(a))
        if len(letters) != 1:
            what = "no letter" if not letters else f"several letters {sorted(letters)}"
            return Verdict(0.0, False, f"{how}: {what} in {quote(answers[-1])}")
        got = letters.pop()
        passed = got == want
        return Verdict(float(passed), passed, f"{how}: chose {got}, reference {want}")

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, answer)."""
        return map_rows(self.name, batch, lambda row: self.check(row["text"], row["answer"]))


class Regex(Verifier):
    """The `regex` verifier: the final answer (or, with `whole: true`, the whole text)
    fully matches the reference answer read as a regular expression."""

    name = "regex"

    class Options(Verifier.Options):
        whole: bool = Field(False, description="match the whole text, not the final answer")
        flags: str = Field("", description='"i": ignore case')

    def __init__(self, whole: bool = False, flags: str = ""):
        self.whole = whole
        self.flags = re.IGNORECASE if "i" in flags else 0

    def check(self, text: str, reference: str | None) -> Verdict:
        """The verdict on one completion."""
        if not reference:
            return Verdict(0.0, False, "no reference pattern for this prompt")
        try:
            rx = re.compile(reference, self.flags | re.DOTALL)
        except re.error as e:
            return Verdict(0.0, False, f"reference is not a valid regex: {e}")
        if self.whole:
            subject, how = text.strip(), "whole text"
        else:
            answers, how = final_answers(text)
            if not answers:
                return Verdict(0.0, False, "no final answer found")
            subject = answers[-1]
        passed = rx.fullmatch(subject) is not None
        verb = "matches" if passed else "does not match"
        shown = f"{quote(subject, 80)} {verb} /{reference[:160]}/"
        return Verdict(float(passed), passed, f"{how}: {shown}")

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, answer)."""
        return map_rows(self.name, batch, lambda row: self.check(row["text"], row["answer"]))


class Format(Verifier):
    """The `format` verifier: required tags or sections are present, in order, once each;
    optionally the text inside `json_tag` (or the whole text) is JSON valid against
    `json_schema`.

    Options: `required` (list of strings, e.g. ["<think>", "</think>", "<answer>",
    "</answer>"]), `json_schema` (a JSON Schema object), `json_tag` (e.g. "answer").
    """

    name = "format"

    class Options(Verifier.Options):
        required: list[str] | None = Field(
            None, description="tags or sections that appear once each, in this order"
        )
        json_schema: dict[str, Any] | None = Field(
            None, description="a JSON Schema the JSON inside json_tag (or the text) meets"
        )
        json_tag: str | None = Field(None, description='the tag around the JSON, e.g. "answer"')

        @field_validator("json_schema")
        @classmethod
        def _schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
            if schema is not None:
                import jsonschema

                try:
                    jsonschema.Draft202012Validator.check_schema(schema)
                except jsonschema.SchemaError as e:
                    raise ValueError(f"not a valid JSON Schema: {e.message}") from None
            return schema

    def __init__(
        self,
        required: list[str] | None = None,
        json_schema: dict | None = None,
        json_tag: str | None = None,
    ):
        self.required = required or []
        self.json_schema = json_schema
        self.json_tag = json_tag
        self._validator = None
        if json_schema is not None:
            import jsonschema

            jsonschema.Draft202012Validator.check_schema(json_schema)
            self._validator = jsonschema.Draft202012Validator(json_schema)

    def check(self, text: str) -> Verdict:
        """The verdict on one completion."""
        pos = 0
        for marker in self.required:
            count = text.count(marker)
            if count != 1:
                what = "missing" if count == 0 else f"appears {count} times"
                return Verdict(0.0, False, f"{marker!r} {what}")
            at = text.find(marker)
            if at < pos:
                return Verdict(0.0, False, f"{marker!r} is out of order")
            pos = at + len(marker)
        if self._validator is not None:
            body = text
            if self.json_tag:
                m = re.search(rf"<{self.json_tag}>(.*?)</{self.json_tag}>", text, re.DOTALL)
                if not m:
                    return Verdict(0.0, False, f"no <{self.json_tag}> block with JSON")
                body = m.group(1)
            body = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", body.strip())
            try:
                value = json.loads(body)
            except json.JSONDecodeError as e:
                return Verdict(0.0, False, f"not JSON: {e.msg} at column {e.colno}")
            error = next(iter(self._validator.iter_errors(value)), None)
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "top level"
                return Verdict(0.0, False, f"JSON schema: {error.message[:120]} (at {where})")
        return Verdict(1.0, True, "format ok")

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text)."""
        return map_rows(self.name, batch, lambda row: self.check(row["text"]))
