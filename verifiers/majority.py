"""The `majority` verifier: pseudo-labels from the agreement of a prompt's k answers.

For prompts without a reference answer, the answer most of a prompt's candidates agree on
(self-consistency) stands in for one. Each unhinted candidate's final answer is found as
the `math` (or `exact`) verifier finds it; equivalent answers form one group; the largest
group is the pseudo-label when it holds at least `min_agreement` of the prompt's unhinted
candidates (those with no answer count too), at least `min_votes` votes, and no other group
has as many. A candidate passes when its answer is in that group. The reference answer is
never read.

The verifier scores a prompt's candidates together, so a batch must hold all of them
(trait `groups`: the curate flow hands it every candidate of a prompt it verifies).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

import polars as pl
from pydantic import Field, Strict, StrictInt

from thresher.verifiers.base import Verdict, Verifier, quote, verdict_frame
from thresher.verifiers.exact import normalise
from thresher.verifiers.extract import final_answers, latex_spans
from thresher.verifiers.math_answer import clean_answer, math_answers, plain_value
from thresher.verifiers.math_workers import check_in_workers

COMPARES = ("math", "exact")
_COMPARE_TIMEOUT_S = 5.0  # one sympy comparison of two answers, in a math worker
HINTED = "majority does not judge hinted candidates: they saw the reference answer"
TAUGHT = "majority does not judge a teacher's candidates: the student's vote is no label for them"
NO_ANSWER = "no final answer found"


@dataclass
class Vote:
    """One candidate's final answer: `shown` as written, `key` what equal answers share
    (a plain number's value, a normalised string), `ref` how the math verifier reads it
    as a reference (None: compared by key alone), `text` the completion it came from."""

    shown: str
    key: object
    ref: str | None = None
    text: str = ""


@dataclass
class Group:
    """Candidates whose answers are equivalent (row indices, in batch order)."""

    shown: str
    members: list[int] = field(default_factory=list)


def _math_vote(text: str) -> Vote | str:
    """The candidate's final answer as the math verifier finds it, or why there is none."""
    answers, how = math_answers(text)
    if not answers:
        return NO_ANSWER
    values = [plain_value(a) for a in answers]
    if all(v is not None for v in values):
        distinct = set(values)
    else:  # several answers not all plain numbers: different writings count as different
        distinct = {clean_answer(a.text) for a in answers}
    if len(distinct) > 1:
        return f"hedged: {len(distinct)} different final answers ({how})"
    last, value = answers[-1], values[-1]
    if last.kind == "latex":
        start, end = latex_spans(text)[-1]
        shown = text[start:end]
        return Vote(shown.strip("$ ").strip(), ("latex", shown), shown, text)
    shown = clean_answer(last.text)
    if value is not None:
        return Vote(shown, value, None, text)  # equal Decimals hash alike: 20 and 20.0
    ref = "\\boxed{" + shown + "}" if last.kind == "expr" else "The answer is " + last.text
    return Vote(shown, (last.kind, shown), ref, text)


def _exact_vote(text: str) -> Vote | str:
    """The candidate's final answer as the exact verifier finds and normalises it."""
    answers, how = final_answers(text)
    if not answers:
        return NO_ANSWER
    keys = {normalise(a) for a in answers}
    if len(keys) > 1:
        return f"hedged: {len(keys)} different final answers ({how})"
    return Vote(answers[-1].strip(), keys.pop())


def _groups_by_key(votes: dict[int, Vote]) -> list[Group]:
    """Answers with the same key, in order of first appearance."""
    by_key: dict[object, Group] = {}
    for i, vote in votes.items():
        by_key.setdefault(vote.key, Group(vote.shown)).members.append(i)
    return list(by_key.values())


def _comparisons(groups: list[Group], votes: dict[int, Vote]) -> list[tuple[int, int, tuple]]:
    """(i, j, math worker job) for each pair of groups whose keys cannot tell whether they
    are equal: one of the two is more than a plain number."""
    out = []
    for j, later in enumerate(groups):
        b = votes[later.members[0]]
        for i in range(j):
            a = votes[groups[i].members[0]]
            if b.ref is not None:
                out.append((i, j, (a.text, b.ref, None)))
            elif a.ref is not None:
                out.append((i, j, (b.text, a.ref, None)))
    return out


def _merged(groups: list[Group], equal: list[tuple[int, int]]) -> list[Group]:
    """`groups` with the equal pairs joined (transitively), each named by its first."""
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in equal:
        a, b = sorted((root(i), root(j)))
        parent[b] = a
    merged: dict[int, Group] = {}
    for i, g in enumerate(groups):
        r = root(i)
        merged.setdefault(r, Group(groups[r].shown)).members.extend(g.members)
    return [Group(g.shown, sorted(g.members)) for g in merged.values()]


def merge_equivalent(prompts: list[tuple[list[Group], dict[int, Vote]]]) -> list[list[Group]]:
    """Each prompt's groups with those the math verifier finds equal ("1/2" and "0.5")
    joined; every prompt's comparisons run in one batch of math workers."""
    todo = [(p, i, j, job) for p, (g, v) in enumerate(prompts) for i, j, job in _comparisons(g, v)]
    equal: list[list[tuple[int, int]]] = [[] for _ in prompts]
    if todo:
        results = check_in_workers([job for *_, job in todo], _COMPARE_TIMEOUT_S)
        for (p, i, j, _), (verdict, _) in zip(todo, results, strict=True):
            if verdict.passed:  # a comparison that timed out keeps the answers apart
                equal[p].append((i, j))
    return [_merged(groups, equal[p]) for p, (groups, _) in enumerate(prompts)]


def _share(votes: int, n: int) -> float:
    return votes / n if n else 0.0


def pseudo_label(
    groups: list[Group], n: int, min_agreement: float, min_votes: int
) -> tuple[Group | None, str]:
    """(the majority group or None, the reason that names the vote) for a prompt whose n
    unhinted candidates gave these answer groups."""
    ranked = sorted(groups, key=lambda g: -len(g.members))
    if not ranked:
        return None, f"no pseudo-label: none of {n} candidates gave a final answer"
    top, votes = ranked[0], len(ranked[0].members)
    weak = f"no pseudo-label: top answer {quote(top.shown)} has {votes} of {n}"
    if votes < min_votes:
        return None, f"{weak} (< {min_votes} votes)"
    # a small tolerance: 0.7 * 10 is 7.000000000000001 in floats
    if _share(votes, n) < min_agreement - 1e-9:
        return None, f"{weak} (< {min_agreement:g})"
    if len(ranked) > 1 and len(ranked[1].members) == votes:
        tied = " and ".join(quote(g.shown) for g in ranked if len(g.members) == votes)
        return None, f"no pseudo-label: tie between {tied} with {votes} of {n} each"
    return top, f"pseudo-label {quote(top.shown)}: {votes} of {n} answers agree"


class Majority(Verifier):
    """Pass the candidates whose final answer is the one most of the prompt's candidates
    give (a pseudo-label for prompts without a reference answer); the reference is ignored.

    Options: `min_agreement` (the share of the prompt's unhinted candidates the top answer
    needs, 0 < x <= 1), `min_votes` (the votes it needs, >= 1), `compare` ("math":
    equivalence as the math verifier reads answers; "exact": the exact verifier's
    normalised strings). Hinted candidates fail and do not vote. Score: the share of the
    prompt's candidates that agree with this candidate's answer.
    """

    name = "majority"
    version = 2  # 2: answers found the way the rule verifiers find them now ("X is the answer")
    groups = True  # scores a prompt's candidates together: a batch holds all of them

    class Options(Verifier.Options):
        min_agreement: Annotated[float, Strict()] = Field(
            0.5, gt=0, le=1, description="share of the prompt's unhinted candidates needed"
        )
        min_votes: StrictInt = Field(2, ge=1, description="votes the top answer needs")
        compare: Literal["math", "exact"] = Field(
            "math", description="math: equivalent as math reads them; exact: normalised text"
        )

    def __init__(self, min_agreement: float = 0.5, min_votes: int = 2, compare: str = "math"):
        if isinstance(min_agreement, bool) or not isinstance(min_agreement, int | float):
            raise ValueError(f"majority: min_agreement must be a number, not {min_agreement!r}")
        if not 0 < min_agreement <= 1:
            raise ValueError(f"majority: min_agreement must be in (0, 1], not {min_agreement}")
        if isinstance(min_votes, bool) or not isinstance(min_votes, int) or min_votes < 1:
            raise ValueError(f"majority: min_votes must be an integer >= 1, not {min_votes!r}")
        if compare not in COMPARES:
            raise ValueError(
                f"majority: compare must be one of {', '.join(COMPARES)}, not {compare!r}"
            )
        self.min_agreement = float(min_agreement)
        self.min_votes = min_votes
        self.compare = compare

    def run(self, batch: pl.DataFrame) -> pl.DataFrame:
        """One verdict per row (columns candidate_id, prompt_id, text; hinted if present),
        judged against the majority of the rows of the same prompt."""
        start = time.perf_counter()
        missing = {"candidate_id", "prompt_id", "text"} - set(batch.columns)
        if missing:
            raise ValueError(f"majority needs the columns {sorted(missing)} in its batch")
        texts = batch["text"].to_list()
        hinted = (
            [bool(h) for h in batch["hinted"].to_list()]
            if "hinted" in batch.columns
            else [False] * batch.height
        )
        sources = batch["source"].to_list() if "source" in batch.columns else [None] * len(hinted)
        read = _math_vote if self.compare == "math" else _exact_vote
        verdicts: list[Verdict | None] = [None] * batch.height
        prompts: dict[str, tuple[list[int], dict[int, Vote]]] = {}
        for i, prompt_id in enumerate(batch["prompt_id"].to_list()):
            rows, votes = prompts.setdefault(prompt_id, ([], {}))
            if hinted[i]:
                taught = (sources[i] or "").startswith("teacher:")
                verdicts[i] = Verdict(0.0, False, TAUGHT if taught else HINTED)
                continue
            rows.append(i)
            vote = read(texts[i] or "")
            if isinstance(vote, str):
                verdicts[i] = Verdict(0.0, False, vote)
            else:
                votes[i] = vote
        keyed = [(_groups_by_key(votes), votes) for _, votes in prompts.values()]
        grouped = merge_equivalent(keyed) if self.compare == "math" else [g for g, _ in keyed]
        for (rows, votes), groups in zip(prompts.values(), grouped, strict=True):
            self._decide(rows, votes, groups, verdicts)
        each = (time.perf_counter() - start) * 1000 / max(batch.height, 1)
        ids = batch["candidate_id"].to_list()
        return verdict_frame(self.name, ids, verdicts, [each] * batch.height)  # type: ignore[arg-type]

    def _decide(
        self,
        rows: list[int],
        votes: dict[int, Vote],
        groups: list[Group],
        verdicts: list[Verdict | None],
    ) -> None:
        """Fill in the verdicts of one prompt's answering candidates."""
        n = len(rows)
        label, why = pseudo_label(groups, n, self.min_agreement, self.min_votes)
        for g in groups:
            score = _share(len(g.members), n)
            for i in g.members:
                if label is None:
                    verdicts[i] = Verdict(score, False, why)
                elif g is label:
                    verdicts[i] = Verdict(score, True, f"{why}; this answer agrees")
                else:
                    own = quote(votes[i].shown)
                    verdicts[i] = Verdict(score, False, f"{why}; this answer {own} disagrees")
