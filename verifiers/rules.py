"""Rule verifiers: multiple-choice letter, regex, and output format."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import polars as pl
from pydantic import Field, field_validator

from thresher.verifiers.base import HeldOutRole, Verdict, Verifier, map_rows, quote
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
        return Verdict(float(passed), passed, f"{how}: chose {got}, reference {want}", got)

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


class AnswerFormat(Verifier):
    """The `answer_format` verifier: the answer is stated the way the prompt asked, between
    `<tag>` and `</tag>` (reasoning-gym's own reading: the last such pair, not empty).

    A separate verdict from correctness: a rule such as "reasoning_gym and answer_format"
    is the environment's protocol, the correctness verifier alone the lenient reading.
    Options: `tag` (default "answer"), `when` ("asked": only where the prompt's text names
    `<tag>`, other prompts pass as asking no format; "always").
    """

    name = "answer_format"

    class Options(Verifier.Options):
        tag: str = Field("answer", pattern=r"^[A-Za-z][\w-]*$", description="the tag's name")
        when: Literal["asked", "always"] = Field(
            "asked", description="judge every prompt, or only those whose text names the tag"
        )

    @classmethod
    def held_out_role(cls) -> HeldOutRole:
        """The asked format: kept beside the reference verifiers in held-out evaluation
        (reported as the lenient reading and the `format` share) and left out of the rule
        while a round restates answers outside it."""
        return "asked_format"

    def __init__(self, tag: str = "answer", when: str = "asked"):
        self.tag, self.when = tag, when
        self._pair = re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)

    def check(self, text: str, asked_in: str) -> Verdict:
        """The verdict on one completion of a prompt whose text is `asked_in`."""
        opener = f"<{self.tag}>"
        if self.when == "asked" and opener not in (asked_in or ""):
            return Verdict(1.0, True, f"the prompt asks for no {opener} format")
        found = self._pair.findall(text or "")
        if not found:
            said = "no" if opener not in (text or "") else f"an unclosed {opener},"
            return Verdict(0.0, False, f"{said} {opener}...</{self.tag}> answer")
        answer = found[-1].strip()
        if not answer:
            return Verdict(0.0, False, f"the last {opener}...</{self.tag}> is empty")
        return Verdict(1.0, True, f"answer {quote(answer)} in {opener} tags", answer)

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, text, and prompt or messages)."""
        return map_rows(self.name, batch, lambda row: self.check(row["text"], _asked_in(row)))


def _asked_in(row: dict) -> str:
    """The prompt's text as the model read it: the prompt, or its messages' JSON."""
    return (row.get("prompt") or "") + (row.get("messages") or "")
