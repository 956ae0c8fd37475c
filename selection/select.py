"""Selection: which verified candidates of a round become training data, and why the rest don't.

`RULES` lists the selection rules in the order they run. Each drops some of the candidates
no earlier rule dropped and records why as its `DropReason` (some with a detail:
`contaminated:<eval item>`, `duplicate_of:<id>`); a candidate no rule drops is kept. One
`selections` row each, written through the store; the rules themselves read nothing but the
rows they are given and their `Context`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from thresher.answers import answer_key
from thresher.config import SelectConfig, SuspectConfig
from thresher.hints import copied_share
from thresher.ids import seeded_key
from thresher.plan import RoundPlan
from thresher.selection.minhash import near_duplicates, signatures
from thresher.stores.lake import Lake
from thresher.stores.queries import (
    answer_votes,
    kept_texts,
    prompt_kill_rates,
    reference_answers,
    selected_count,
    selection_inputs,
)
from thresher.stores.schemas import TEACHER, DropReason
from thresher.stores.tables import write_evidence, write_selections


def normalised_hash(text: str, lowercase: bool) -> str:
    """Hash of the text with whitespace collapsed (and case folded when asked)."""
    t = re.sub(r"\s+", " ", text.strip())
    return hashlib.blake2b((t.lower() if lowercase else t).encode(), digest_size=8).hexdigest()


def farthest_first(sigs: np.ndarray, k: int) -> list[int]:
    """Greedy max-min diversity: start from row 0, then add the row least similar
    (estimated Jaccard) to everything chosen so far."""
    chosen = [0]
    nearest = (sigs == sigs[0]).mean(axis=1)  # similarity to the closest chosen row
    nearest[0] = np.inf
    while len(chosen) < min(k, len(sigs)):
        nxt = int(np.argmin(nearest))  # ties go to the earlier row
        chosen.append(nxt)
        nearest = np.maximum(nearest, (sigs == sigs[nxt]).mean(axis=1))
        nearest[chosen] = np.inf
    return chosen


@dataclass
class Context:
    """What the rules read besides a batch's rows: the settings and what the lake knows."""

    spec: SelectConfig
    by_prompt: dict[str, list[dict]]  # the batch's rows of each prompt, in row order
    kept_before: list[tuple] | None = None  # (candidate_id, signature) kept in earlier batches
    eval_index: Any = None  # a decontam.EvalIndex
    max_hinted_share: float | None = None
    kill_rates: dict[str, float | None] | None = None  # prompt -> its tests' kill rate
    reference_shares: dict[str, dict[str, float]] | None = None  # task -> answer -> share
    suspects: dict[str, dict] | None = None  # prompt -> why its reference looks wrong
    sigs: dict[str, np.ndarray] = field(default_factory=dict)  # candidate_id -> signature
    evidence: list[dict] = field(default_factory=list)  # what the flags rest on (`evidence`)

    def sign(self, rows: list[dict]) -> None:
        """Set each row's `sig`, its text's MinHash signature (computed once per batch)."""
        todo = [r for r in rows if r["candidate_id"] not in self.sigs]
        if todo:
            s = self.spec
            new = signatures(
                [r["text"] for r in todo], s.num_perm, s.shingle_size, lowercase=s.lowercase
            )
            self.sigs.update(zip((r["candidate_id"] for r in todo), new, strict=True))
        for r in rows:
            r["sig"] = self.sigs[r["candidate_id"]]


def alive(rows: list[dict]) -> list[dict]:
    """The rows no rule has dropped so far."""
    return [r for r in rows if r["reason"] is None]


class Rule:
    """One selection rule: drops some of the rows still kept, giving `reason` as why."""

    reason: DropReason
    column: str | None = None  # the funnel's count of its drops (stores' FUNNEL_COUNTS_SQL)

    def on(self, ctx: Context) -> bool:
        """Whether the settings ask for this rule."""
        return True

    def apply(self, rows: list[dict], ctx: Context) -> None:
        """Drop the rows of one batch that this rule does not keep."""
        raise NotImplementedError

    def drop(self, row: dict, detail: str | None = None) -> None:
        """Record this rule's reason on a row, unless an earlier rule dropped it."""
        if row["reason"] is None:
            row["reason"] = self.reason.value if detail is None else self.reason.of(detail)


class Failed(Rule):
    """The verify rule does not hold."""

    reason = DropReason.failed

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for r in rows:
            if not r["passed"]:
                self.drop(r)


class Truncated(Rule):
    """It passed but was cut at max_tokens (unless `keep_truncated`)."""

    reason = DropReason.truncated
    column = "truncated_dropped"

    def on(self, ctx: Context) -> bool:
        return not ctx.spec.keep_truncated

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for r in rows:
            if r.get("finish_reason") == "length":
                self.drop(r)


class CopiesHint(Rule):
    """Sampled with part of a solution as its hint, it mostly restates that hint: more than
    `max_hint_copy` of its words lie in 3-grams of the hint."""

    reason = DropReason.copies_hint
    column = "copies_hint"

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for r in alive(rows):
            if r.get("hint") and copied_share(r["text"], r["hint"]) > ctx.spec.max_hint_copy:
                self.drop(r)


class WeakTests(Rule):
    """Its prompt's tests kill fewer mutants than `min_test_strength`, or were never audited."""

    reason = DropReason.weak_tests

    def on(self, ctx: Context) -> bool:
        return ctx.spec.min_test_strength is not None

    def apply(self, rows: list[dict], ctx: Context) -> None:
        rates = ctx.kill_rates or {}
        for r in alive(rows):
            if not r.get("has_tests"):
                continue
            if r["prompt_id"] not in rates:
                self.drop(r, "not audited")
            elif (rate := rates[r["prompt_id"]]) is None or rate < ctx.spec.min_test_strength:
                self.drop(r, f"{rate or 0:.2f}")


class TooEasy(Rule):
    """Its prompt's pass rate (of unhinted candidates, if any) is above `max_pass_rate`."""

    reason = DropReason.too_easy
    column = "too_easy"

    def on(self, ctx: Context) -> bool:
        return ctx.spec.max_pass_rate is not None

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for group in ctx.by_prompt.values():
            plain = [r for r in group if not r["hinted"]] or group
            if sum(r["passed"] for r in plain) / len(plain) > ctx.spec.max_pass_rate:
                for r in group:
                    self.drop(r)


class Contaminated(Rule):
    """Its prompt or its text overlaps an evaluation item (the decontamination index)."""

    reason = DropReason.contaminated
    column = "contaminated"

    def on(self, ctx: Context) -> bool:
        return ctx.eval_index is not None

    def apply(self, rows: list[dict], ctx: Context) -> None:
        kept = alive(rows)
        # every prompt of the batch is checked, so the evidence lists each reworded item
        # whether or not a candidate of it passed
        prompt_text = {r["prompt_id"]: r["prompt"] or r["messages"] or "" for r in rows}
        pids = list(prompt_text)
        prompt_hits = ctx.eval_index.match([prompt_text[p] for p in pids])
        by_prompt = dict(zip(pids, prompt_hits, strict=True))
        semantic = ctx.eval_index.semantic
        if semantic is not None:
            todo = [p for p in pids if by_prompt[p] is None]
            refs = {r["prompt_id"]: r["reference"] for r in rows}
            found = semantic.match([prompt_text[p] for p in todo], [refs[p] for p in todo])
            for p, ev in zip(todo, found, strict=True):
                if ev is not None:
                    by_prompt[p] = f"reworded:{ev['eval_prompt_id']}"
                    ctx.evidence.append({"prompt_id": p, "kind": "reworded", **ev})
        text_hits = ctx.eval_index.match([r["text"] for r in kept])
        for r, hit in zip(kept, text_hits, strict=True):
            hit = by_prompt[r["prompt_id"]] or hit
            if hit is not None:
                self.drop(r, hit)


class SuspectReference(Rule):
    """Its prompt's samples agree on another answer than its reference (`select.suspects`),
    and no one has labelled that reference right since."""

    reason = DropReason.suspect_reference
    column = "suspect_reference"

    def on(self, ctx: Context) -> bool:
        return bool(ctx.suspects)

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for p, flag in ctx.suspects.items():
            ctx.evidence.append({"prompt_id": p, "kind": "suspect_reference",
                                 "eval_prompt_id": "", **flag})  # fmt: skip
            for r in ctx.by_prompt.get(p, []):
                self.drop(r, str(flag["agreed"])[:60])


def suspect_references(votes: list[dict], spec: SuspectConfig) -> dict[str, dict]:
    """prompt -> the evidence that its reference is wrong, from its samples' final answers
    (rows of prompt_id, reference as judged, label, answer, model): counting only models
    reliable elsewhere (`reliable_models`), at least `min_samples` answers, one answer not
    the reference given by `min_share` of them and the reference by at most
    `max_reference_share`; a reference labelled right is not suspect."""
    reliable = reliable_models(votes, spec)
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for v in votes:
        if v["model"] in reliable:
            by_prompt[v["prompt_id"]].append(v)
    out = {}
    for p, group in by_prompt.items():
        first = group[0]
        reference = answer_key(first["judged_by"])
        if first["label"] == "right" or reference is None or len(group) < spec.min_samples:
            continue
        counts = Counter(answer_key(v["answer"]) for v in group)
        agreed, n = _top(counts)
        share, ref_share = n / len(group), counts.get(reference, 0) / len(group)
        if agreed == reference or share < spec.min_share or ref_share > spec.max_reference_share:
            continue
        models = Counter(v["model"] for v in group if answer_key(v["answer"]) == agreed)
        out[p] = {"agreed": agreed, "share": round(share, 4), "samples": len(group),
                  "reference_share": round(ref_share, 4), "reference": first["judged_by"],
                  "models": json.dumps(dict(sorted(models.items())))}  # fmt: skip
    return out


def reliable_models(votes: list[dict], spec: SuspectConfig) -> set[str]:
    """The models whose own samples, on the prompts where they agreed (`min_share` of at
    least 4 answers), agreed on the reference at least `min_model_agreement` of the time,
    over `min_model_prompts` prompts at least."""
    per: dict[tuple, list[str | None]] = defaultdict(list)
    refs = {}
    for v in votes:
        per[(v["model"], v["prompt_id"])].append(answer_key(v["answer"]))
        refs[v["prompt_id"]] = answer_key(v["judged_by"])
    agreed: dict[str, list[bool]] = defaultdict(list)
    for (model, prompt), answers in per.items():
        if len(answers) < 4:
            continue
        top, n = _top(Counter(answers))
        if n / len(answers) >= spec.min_share:
            agreed[model].append(top == refs[prompt])
    return {
        m for m, hits in agreed.items()
        if len(hits) >= spec.min_model_prompts
        and sum(hits) / len(hits) >= spec.min_model_agreement
    }  # fmt: skip


def _top(counts: Counter) -> tuple:
    """The commonest answer and its count (ties: the larger key, for a stable choice)."""
    return max(counts.items(), key=lambda kv: (kv[1], kv[0] or ""))


class Duplicate(Rule):
    """The same normalised text as a candidate of its prompt kept before it."""

    reason = DropReason.duplicate_of
    column = "duplicates"

    def apply(self, rows: list[dict], ctx: Context) -> None:
        seen: dict[tuple, str] = {}
        for r in alive(rows):
            key = (r["prompt_id"], normalised_hash(r["text"], ctx.spec.lowercase))
            if key in seen:
                self.drop(r, seen[key])
            else:
                seen[key] = r["candidate_id"]


class NearDuplicate(Rule):
    """A MinHash near-duplicate of a candidate kept before it: of its prompt, or with
    `across_prompts` of any prompt, earlier batches included."""

    reason = DropReason.duplicate_of
    column = "duplicates"

    def on(self, ctx: Context) -> bool:
        return ctx.spec.near_dup

    def apply(self, rows: list[dict], ctx: Context) -> None:
        kept = alive(rows)
        if not kept:
            return
        ctx.sign(kept)
        across = ctx.spec.across_prompts
        before = (ctx.kept_before or []) if across else []
        sigs = np.vstack([*(s for _, s in before), *(r["sig"] for r in kept)])
        ids = [c for c, _ in before] + [r["candidate_id"] for r in kept]
        groups = ["*"] * len(ids) if across else [r["prompt_id"] for r in kept]
        dups = near_duplicates(sigs, groups, ctx.spec.threshold)
        for r, dup in zip(kept, dups[len(before) :], strict=True):
            if dup is not None:
                self.drop(r, ids[dup])


class Capped(Rule):
    """Over the per-prompt `cap`, its prompt's candidates ranked by `policy`."""

    reason = DropReason.capped
    column = "capped"

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for group in ctx.by_prompt.values():
            for r in beyond(alive(group), ctx.spec.cap, ctx):
                self.drop(r)


class AnswerShare(Rule):
    """Its task keeps more of its final answer than the references hold (`answer_balance`)."""

    reason = DropReason.answer_share
    column = "answer_share"

    def on(self, ctx: Context) -> bool:
        return ctx.spec.answer_balance is not None

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for task in sorted({r.get("task") or "" for r in rows}):
            part = [r for r in rows if (r.get("task") or "") == task]
            shares = (ctx.reference_shares or {}).get(task, {})
            balance_answers(part, shares, ctx.spec.answer_balance)


class HintShare(Rule):
    """A hinted candidate over the batch's share of hinted data (`max_hinted_share`)."""

    reason = DropReason.hint_share
    column = "hint_share"

    def on(self, ctx: Context) -> bool:
        return ctx.max_hinted_share is not None and ctx.max_hinted_share < 1

    def apply(self, rows: list[dict], ctx: Context) -> None:
        kept = [r for r in alive(rows) if not is_teacher(r)]
        hinted = [r for r in kept if r["hinted"]]
        for r in hinted[allowed(ctx.max_hinted_share, len(kept) - len(hinted)) :]:
            self.drop(r)


class TeacherCap(Rule):
    """A teacher's candidate over `teacher_cap` of its prompt (ranked by `policy`), before
    the prompt's `cap` counts it."""

    reason = DropReason.teacher_share
    column = "teacher_share"

    def apply(self, rows: list[dict], ctx: Context) -> None:
        for group in ctx.by_prompt.values():
            taught = [r for r in alive(group) if is_teacher(r)]
            for r in beyond(taught, ctx.spec.teacher_cap, ctx):
                self.drop(r)


class TeacherShare(Rule):
    """A teacher's candidate over the batch's share of teacher data (`max_teacher_share`)."""

    reason = DropReason.teacher_share
    column = "teacher_share"

    def apply(self, rows: list[dict], ctx: Context) -> None:
        kept = alive(rows)
        taught = [r for r in kept if is_teacher(r)]
        for r in taught[allowed(ctx.spec.max_teacher_share, len(kept) - len(taught)) :]:
            self.drop(r)


def beyond(rows: list[dict], cap: int, ctx: Context) -> list[dict]:
    """Of one prompt's rows, those past the first `cap` as `policy` ranks them."""
    if len(rows) <= cap:
        return []
    if ctx.spec.policy == "diverse":
        ctx.sign(rows)
    return _rank(rows, ctx.spec)[cap:]


def is_teacher(row: dict) -> bool:
    """Whether a teacher made this candidate."""
    return (row.get("source") or "").startswith(TEACHER)


def allowed(share: float, others: int) -> int:
    """How many rows of one kind may join `others` kept rows within `share` of them all."""
    if share >= 1:
        return 10**9
    return int(share * others / (1 - share) + 1e-9)


RULES: tuple[Rule, ...] = (
    Failed(),
    Truncated(),
    CopiesHint(),
    WeakTests(),
    TooEasy(),
    Contaminated(),
    SuspectReference(),
    Duplicate(),
    NearDuplicate(),
    TeacherCap(),
    Capped(),
    AnswerShare(),
    HintShare(),
    TeacherShare(),
)
# The drop reasons in the order the rules give them, and the funnel's counts of them
# (the `round_funnel` view's columns) in that order.
REASONS: tuple[DropReason, ...] = tuple(dict.fromkeys(rule.reason for rule in RULES))
FUNNEL_DROPS: tuple[str, ...] = tuple(dict.fromkeys(r.column for r in RULES if r.column))


def decide(
    rows: list[dict],
    spec: SelectConfig,
    kept_before: list[tuple] | None = None,
    eval_index: Any = None,
    max_hinted_share: float | None = None,
    kill_rates: dict[str, float | None] | None = None,
    reference_shares: dict[str, dict[str, float]] | None = None,
    suspects: dict[str, dict] | None = None,
) -> list[dict]:
    """Set `reason` (None = kept) on each row dict of one batch, in place, by `RULES`;
    returns the evidence of its flags (reworded eval items, suspect references).

    Rows must be ordered by prompt, then unhinted before hinted, then sample index.
    `kept_before` holds (candidate_id, signature) of candidates kept in earlier batches,
    for near-duplicate checks across prompts; `eval_index` (a decontam.EvalIndex) finds
    overlaps with evaluation items; `max_hinted_share` caps the hinted share of what is
    kept; `kill_rates` (prompt -> its tests' kill rate) decide `min_test_strength`;
    `reference_shares` (task -> answer key -> share of the round's references) bound what
    `answer_balance` keeps of each answer; `suspects` (prompt -> evidence) are the prompts
    whose references look wrong.
    """
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        r["reason"] = None
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    ctx = Context(
        spec, by_prompt, kept_before, eval_index, max_hinted_share, kill_rates,
        reference_shares, suspects,
    )  # fmt: skip
    for rule in RULES:
        if rule.on(ctx):
            rule.apply(rows, ctx)
    return ctx.evidence


def balance_answers(rows: list[dict], shares: dict[str, float], margin: float) -> None:
    """Drop kept rows of one task (reason `answer_share:<answer>`) until no final answer's
    share of what is kept exceeds its share in `shares` plus `margin` (one of each answer
    always stays); rows of the prompts with most kept rows go first, the last sampled of
    them first."""
    kept = alive(rows)
    keys = {id(r): answer_key(r.get("answer")) for r in kept}
    changed = True
    while changed:
        changed = False
        kept = alive(kept)
        counts = Counter(k for k in (keys[id(r)] for r in kept) if k is not None)
        for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            limit = shares.get(key, 0.0) + margin
            if limit >= 1 or n <= limit * len(kept) + 1e-9:
                continue
            # n' <= limit * (len(kept) - n + n')  =>  n' <= limit * (len(kept) - n) / (1 - limit);
            # one of each answer always stays (on a handful kept, any answer is over its share,
            # and dropping rare answers would only hand the share back to the common one)
            allowed = max(1, int(limit * (len(kept) - n) / (1 - limit) + 1e-9))
            if n <= allowed:
                continue
            per_prompt = Counter(r["prompt_id"] for r in kept)
            these = [r for r in kept if keys[id(r)] == key]
            these.sort(key=lambda r: (-per_prompt[r["prompt_id"]], -r["sample_idx"]))
            for r in these[: n - allowed]:
                r["reason"] = DropReason.answer_share.of(key[:60])
                per_prompt[r["prompt_id"]] -= 1
            changed = True
            break  # the kept total changed: measure every answer again


def reference_shares(
    references: list[tuple[str | None, str | None]],
) -> dict[str, dict[str, float]]:
    """task -> answer key -> its share of the task's references, from (task, reference)."""
    per_task: dict[str, Counter] = defaultdict(Counter)
    for task, reference in references:
        key = answer_key(reference)
        if key is not None:
            per_task[task or ""][key] += 1
    return {
        task: {k: n / sum(counts.values()) for k, n in counts.items()}
        for task, counts in per_task.items()
    }


def _rank(kept: list[dict], spec: SelectConfig) -> list[dict]:
    """The prompt's surviving candidates, best first, unhinted before hinted."""
    out = []
    for hinted in (False, True):
        part = [r for r in kept if r["hinted"] == hinted]
        if not part:
            continue
        if spec.policy == "diverse":
            order = farthest_first(np.vstack([r["sig"] for r in part]), len(part))
            part = [part[i] for i in order]
        elif spec.policy == "shortest":
            part = sorted(part, key=lambda r: (r["n_tokens"] or len(r["text"]), r["sample_idx"]))
        elif spec.policy == "top_score":
            part = sorted(part, key=lambda r: (-(r["score"] or 0.0), r["sample_idx"]))
        elif spec.policy == "random":
            part = sorted(part, key=lambda r: seeded_key(spec.seed, r["candidate_id"]))
        out += part
    return out


def select_batch(
    lake: Lake,
    plan: RoundPlan,
    settings: SelectConfig,
    candidate_ids: list[str],
    eval_index: Any = None,
) -> int:
    """Write the plan's selection of these candidates; returns rows written (0 when this
    selection of them is in the lake already).

    The plan's rule (e.g. "math and format") says which verdicts make a candidate pass (by
    default every verifier that scored it must have passed it); its digests limit the
    verdicts read to the run's verifier options (none: every verdict), its ranking
    verifiers' scores rank candidates for `top_score`, and its tests suite is the one
    whose strength `min_test_strength` reads."""
    used = plan.digests or None
    rows = selection_inputs(lake, candidate_ids, plan.rule, used, plan.ranking)
    if rows and selected_count(lake, plan.selection_id, candidate_ids) >= len(rows):
        return 0  # this batch was selected already
    kept_before = (
        _kept_signatures(lake, plan.selection_id, settings) if settings.across_prompts else None
    )
    kill_rates = _kill_rates(lake, plan, settings, rows)
    shares = _reference_shares(lake, settings, rows)
    suspects = _suspects(lake, plan, settings, rows)
    evidence = decide(
        rows, settings, kept_before, eval_index, plan.max_hinted_share, kill_rates, shares,
        suspects,
    )  # fmt: skip
    if evidence:  # before the selections: a batch whose selections are written is done
        write_evidence(lake, plan.selection_id, plan.round, evidence, plan.run_id)
    return write_selections(lake, plan.selection_id, plan.round, rows, plan.run_id)


def _suspects(
    lake: Lake, plan: RoundPlan, spec: SelectConfig, rows: list[dict]
) -> dict[str, dict] | None:
    """The rows' prompts whose references look wrong, from the samples of this round and
    earlier (None: `suspects` is off)."""
    if not spec.suspects.enabled or not rows:
        return None
    votes = answer_votes(lake, sorted({r["prompt_id"] for r in rows}), plan.round)
    return suspect_references(votes.to_dicts(), spec.suspects)


def _kill_rates(
    lake: Lake, plan: RoundPlan, spec: SelectConfig, rows: list[dict]
) -> dict[str, float | None] | None:
    """The kill rates of the rows' prompts' tests (None: `min_test_strength` is off)."""
    if spec.min_test_strength is None:
        return None
    prompts = sorted({r["prompt_id"] for r in rows})
    return prompt_kill_rates(lake, prompts, plan.tests_suite)


def _reference_shares(
    lake: Lake, spec: SelectConfig, rows: list[dict]
) -> dict[str, dict[str, float]] | None:
    """The answer shares of the rows' references (None: `answer_balance` is off)."""
    if spec.answer_balance is None or not rows:
        return None
    refs = reference_answers(lake, sorted({r["prompt_id"] for r in rows}))
    return reference_shares(list(zip(refs["task"], refs["reference"], strict=True)))


def _kept_signatures(lake: Lake, selection_id: str, spec: SelectConfig) -> list[tuple]:
    """(candidate_id, signature) of what this selection kept in earlier batches."""
    kept = kept_texts(lake, selection_id)
    if kept.height == 0:
        return []
    sigs = signatures(
        kept["text"].to_list(), spec.num_perm, spec.shingle_size, lowercase=spec.lowercase
    )
    return list(zip(kept["candidate_id"].to_list(), sigs, strict=True))
