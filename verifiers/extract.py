"""Final-answer extraction shared by the rule verifiers."""

from __future__ import annotations

import re

_HASHES = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(
    r"answer\s*(?:is|:)\s*\$?([^\n]+?)\$?\s*(?:\.\s*)?$", re.IGNORECASE | re.MULTILINE
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def boxed_all(text: str) -> list[str]:
    """Contents of every \\boxed{...} (or \\fbox{...}), braces balanced."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1].strip())
    return out


def final_answers(text: str, pattern: str | None = None) -> tuple[list[str], str]:
    """Every final answer the text commits to, and where they were found.

    Looks at, in order: a configured pattern, \\boxed{}, `####`, <answer> tags,
    "the answer is ..."; else the last number. Several answers mean a hedge.
    """
    if pattern:
        found = [m.group(1) if m.groups() else m.group(0) for m in re.finditer(pattern, text)]
        if found:
            return [f.strip() for f in found], "pattern"
    found = boxed_all(text)
    if found:
        return found, "boxed"
    for how, rx in (("####", _HASHES), ("<answer>", _TAG)):
        found = rx.findall(text)
        if found:
            return [f.strip() for f in found], how
    found = _ANSWER_IS.findall(text)
    if found:
        return [found[-1].strip()], "'answer is'"
    found = NUMBER.findall(text)
    if found:
        return [found[-1]], "last number"
    return [], "nothing"


def extract_answer(text: str) -> tuple[str | None, str]:
    """The last final answer in `text` and how it was found."""
    answers, how = final_answers(text)
    return (answers[-1] if answers else None), how
