"""A tool-calling candidate's segments: the model's text, its code blocks and the tool's
outputs, in order; their texts joined are the candidate's text."""

from __future__ import annotations

import json


def model_text(text: str, segments: str | list | None) -> str:
    """The candidate's text without the tool's outputs: what the model itself wrote."""
    if not segments:
        return text
    segs = json.loads(segments) if isinstance(segments, str) else segments
    return "".join(s["text"] for s in segs if s["kind"] != "output")


def tool_spans(text: str, segments: str | list | None) -> list[list[int]]:
    """[start, end) character spans of `text` the tool wrote (its outputs)."""
    if not segments:
        return []
    segs = json.loads(segments) if isinstance(segments, str) else segments
    spans, at = [], 0
    for s in segs:
        n = len(s["text"])
        if s["kind"] == "output":
            spans.append([at, at + n])
        at += n
    if at != len(text):
        raise ValueError("the candidate's segments do not add up to its text")
    return spans
