"""Final-answer extraction shared by the rule verifiers.

Everything here runs in the pipeline's process on untrusted text, so it takes time linear
in the text's length: no regex here can backtrack over the whole text for each match.
"""

from __future__ import annotations

import re
from bisect import bisect_left

_HASHES = re.compile(r"####\s*([^\n]*)")
_TAG_OPEN, _TAG_CLOSE = "<answer>", "</answer>"
# "the answer is ...", "The final answer is ...", "Final Answer: ...": each statement runs
# to the next one on its line, or to the end of the line
_ANSWER_IS = re.compile(r"answer\s*(?:is\s*:?|:)\s*", re.IGNORECASE)
# "0.81 is the final answer": the value stands before its marker (read from a short window
# before it, so that no scan runs back over the whole text)
_IS_ANSWER = re.compile(r"(?<=\s)is\s+(?:the\s+|my\s+|our\s+)?(?:final\s+)?answer\b", re.IGNORECASE)
_BEFORE_MARK = 60
# the words that lead into the next statement ("... 30. So the final answer is 40")
_LEAD_IN = re.compile(
    r"[\s,;]*(?:(?:so|thus|hence|therefore)\s*,?\s*)?(?:the\s+)?(?:final\s+)?$", re.IGNORECASE
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# where math starts, as math-verify's patterns see it: $$..$$ and \[..\] may span lines,
# $..$ and \(..\) may not; a bare \frac{1}{2} counts too
_OPENER = re.compile(r"(?<!\\)(?:\$\$|\\\[|\\\(|\$)|\\frac\{")
_BARE_FRAC = re.compile(r"\\frac\{-?\d+(?:[.,]\d+)?\}\{-?\d+(?:[.,]\d+)?\}")
_CLOSER = {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}


def _positions(text: str, token: str) -> list[int]:
    """Where `token` starts in `text`, skipping escaped ones (after a backslash)."""
    out, at = [], text.find(token)
    while at >= 0:
        if at == 0 or text[at - 1] != "\\":
            out.append(at)
        at = text.find(token, at + 1)
    return out


def _next(positions: list[int], at: int) -> int:
    i = bisect_left(positions, at)
    return positions[i] if i < len(positions) else -1


class _Spans:
    """Finds math spans in one text in linear time (closers looked up, never rescanned)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.closers = {c: _positions(text, c) for c in set(_CLOSER.values())}
        self.newlines = _positions(text, "\n")

    def end(self, opener: str, start: int) -> int:
        """The end of the span opened by `opener` at `start`, or -1."""
        if opener == "\\frac{":
            m = _BARE_FRAC.match(self.text, start)
            return m.end() if m else -1
        if opener == "$" and start and self.text[start - 1].isdigit():
            return -1
        body = start + len(opener)
        close = _next(self.closers[_CLOSER[opener]], body + 1)  # at least one character
        if close < 0:
            return -1
        if opener in ("$", "\\(") and 0 <= _next(self.newlines, body) < close:
            return -1
        return close + len(_CLOSER[opener])

    def all(self) -> list[tuple[int, int]]:
        spans, pos = [], 0
        for m in _OPENER.finditer(self.text):
            if m.start() < pos:
                continue
            end = self.end(m.group(0), m.start())
            if end < 0 and m.group(0) == "$$":  # then it may open $..$ one character on
                end = self.end("$", m.start() + 1)
            if end >= 0:
                spans.append((m.start(), end))
                pos = end
        return spans


def latex_spans(text: str, bare_fractions: bool = True) -> list[tuple[int, int]]:
    """(start, end) of every math span ($..$, $$..$$, \\(..\\), \\[..\\], and unless told
    otherwise a bare \\frac{a}{b}, which math-verify also reads in prose)."""
    spans = _Spans(text).all()
    if bare_fractions:
        return spans
    return [(start, end) for start, end in spans if not text.startswith("\\frac", start)]


def mask_math(text: str) -> tuple[str, int]:
    """`text` with its math blanked out, and where its last readable math span ends (-1).

    Inline math broken over lines (which math-verify does not read) is blanked too: a
    number inside math is never read as a number in prose.
    """
    spans = latex_spans(text)
    chars = list(text)
    for start, end in spans:
        chars[start:end] = " " * (end - start)
    masked = "".join(chars)
    dollars = _positions(masked, "$")
    for a, b in zip(dollars[::2], dollars[1::2], strict=False):
        chars[a : b + 1] = " " * (b + 1 - a)
    closers, covered = _positions(masked, "\\)"), 0
    for a in _positions(masked, "\\("):
        b = _next(closers, max(a + 2, covered))
        if b >= 0 and a >= covered:
            chars[a : b + 2] = " " * (b + 2 - a)
            covered = b + 2
    return "".join(chars), (spans[-1][1] if spans else -1)


def boxed_all(text: str) -> list[str]:
    """Contents of every \\boxed{...} (or \\fbox{...}), braces balanced."""
    matching, stack = {}, []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            matching[stack.pop()] = i
    out = []
    for m in _BOX.finditer(text):
        close = matching.get(m.end() - 1)
        if close is not None:
            out.append(text[m.end() : close].strip())
    return out


def _tagged(text: str) -> list[str]:
    """Contents of every <answer>...</answer> (any case)."""
    lower, out, at = text.lower(), [], 0
    while (start := lower.find(_TAG_OPEN, at)) >= 0:
        end = lower.find(_TAG_CLOSE, start + len(_TAG_OPEN))
        if end < 0:
            break
        out.append(text[start + len(_TAG_OPEN) : end].strip())
        at = end + len(_TAG_CLOSE)
    return out


def marked_answers(text: str, pattern: str | None = None) -> tuple[list[str], str]:
    """The answers the text marks as final, and the marker; ([], "nothing") without one.

    Looks at, in order: a configured pattern, \\boxed{}, `####`, <answer> tags, "the
    (final) answer is ..." / "Final Answer: ..." (the rest of that line, as written).
    """
    if pattern:
        found = [m.group(1) if m.groups() else m.group(0) for m in re.finditer(pattern, text)]
        if found:
            return [f.strip() for f in found], "pattern"
    found = boxed_all(text)
    if found:
        return found, "boxed"
    found = [f.strip() for f in _HASHES.findall(text) if f.strip()]
    if found:
        return found, "####"
    found = _tagged(text)
    if found:
        return found, "<answer>"
    found = answer_statements(text)
    if found:
        return found, "'answer is'"
    return [], "nothing"


def answer_statements(text: str) -> list[str]:
    """What each "the answer is ..." (or "... is the final answer") statement says, in order;
    several different ones are a hedge, as several boxes are. A statement runs to the next
    one on its line, or to the end of the line; one that only leads into the next ("Final
    Answer: The final answer is 7") is read whole, from its line's first marker; "X is the
    answer" says the word or number X just before its marker."""
    out = []
    for line in text.split("\n"):
        marks = list(_ANSWER_IS.finditer(line))
        befores = [_word_before(line, m.start()) for m in _IS_ANSWER.finditer(line)]
        befores = [(at, word) for at, word in befores if word]
        if not marks and not befores:
            continue
        ends = sorted([m.start() for m in marks] + [at for at, _ in befores])
        said = []
        for mark, after in zip(marks, [*marks[1:], None][: len(marks)], strict=True):
            end = next((e for e in ends if e >= mark.end()), len(line))
            part = line[mark.end() : end]
            leads = after is not None and end == after.start()
            said.append((mark.end(), (_LEAD_IN.sub("", part) if leads else part).strip()))
        said = [(at, s.rstrip(".").rstrip()) for at, s in said]
        if len(said) > 1 and not any(s for _, s in said[:-1]) and not befores:
            said = [(0, line[marks[0].end() :].strip().rstrip(".").rstrip())]
        said += befores
        out += [s for _, s in sorted(said) if s]
    return out


def _word_before(line: str, at: int) -> tuple[int, str]:
    """Where the value just before "is the answer" (its "is" at `at`) starts, and the value:
    a $...$ span, or a token with a digit in it; else (at, '')."""
    start = max(0, at - _BEFORE_MARK)
    before = line[start:at].rstrip()
    if before.endswith("$"):
        opened = before.rfind("$", 0, len(before) - 1)
        if opened >= 0:
            return start + opened, before[opened:]
    cut = max(before.rfind(" "), before.rfind("\t")) + 1
    word = before[cut:].strip("*_,;:'\"").rstrip(".")
    return (start + cut, word) if any(c.isdigit() for c in word) else (at, "")


def _unwrap_dollars(answer: str) -> str:
    a = answer[1:] if answer.startswith("$") else answer
    return a[:-1] if a.endswith("$") else a


def final_answers(text: str, pattern: str | None = None) -> tuple[list[str], str]:
    """Every final answer the text commits to, and where they were found.

    Looks at, in order: a configured pattern, \\boxed{}, `####`, <answer> tags,
    "the answer is ..."; else the last number. Several answers mean a hedge.
    """
    found, how = marked_answers(text, pattern)
    if how == "'answer is'":
        return [_unwrap_dollars(f).strip() for f in found], how
    if found:
        return found, how
    found = NUMBER.findall(text)
    if found:
        return [found[-1].rstrip(",")], "last number"  # "6, which ..." reads 6
    return [], "nothing"


def extract_answer(text: str) -> tuple[str | None, str]:
    """The last final answer in `text` and how it was found."""
    answers, how = final_answers(text)
    return (answers[-1] if answers else None), how
