"""Selection: which verified candidates of a round become training data, and why the rest don't.

For each candidate of a batch, in this order: `failed` (the rule does not hold),
`truncated` (it passed but was cut at max_tokens, unless `keep_truncated`),
`weak_tests:<kill rate>` (its prompt's tests kill too few mutants, `min_test_strength`),
`too_easy`
(its prompt's pass rate is above `max_pass_rate`), `contaminated:<eval item>` (its prompt
or text overlaps an evaluation item), `duplicate_of:<id>` (same normalised text, or a
MinHash near-duplicate, of a candidate kept before it), `capped` (over the per-prompt cap
under the chosen policy), `answer_share:<answer>` (its task keeps more of this final answer
than the references hold, `answer_balance`), `hint_share` (a hinted candidate over the
batch's share of hinted data); otherwise kept. One `selections` row each, written through
the store; the decisions themselves read nothing but the rows they are given.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from thresher.config import SelectConfig
from thresher.ids import seeded_key
from thresher.plan import RoundPlan
from thresher.stores.lake import Lake
from thresher.stores.schemas import DropReason


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


def decide(
    rows: list[dict],
    spec: SelectConfig,
    kept_before: list[tuple] | None = None,
    eval_index: Any = None,
    max_hinted_share: float | None = None,
    kill_rates: dict[str, float | None] | None = None,
    reference_shares: dict[str, dict[str, float]] | None = None,
) -> None:
    """Set `reason` (None = kept) on each row dict of one batch, in place.

    Rows must be ordered by prompt, then unhinted before hinted, then sample index.
    `kept_before` holds (candidate_id, signature) of candidates kept in earlier batches,
    for near-duplicate checks across prompts; `eval_index` (a decontam.EvalIndex) finds
    overlaps with evaluation items; `max_hinted_share` caps the hinted share of what is
    kept; `kill_rates` (prompt -> its tests' kill rate) decide `min_test_strength`;
    `reference_shares` (task -> answer key -> share of the round's references) bound what
    `answer_balance` keeps of each answer.
    """
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        r["reason"] = None if r["passed"] else DropReason.failed.value
        if r["reason"] is None and r.get("finish_reason") == "length" and not spec.keep_truncated:
            r["reason"] = DropReason.truncated.value
        by_prompt.setdefault(r["prompt_id"], []).append(r)

    if spec.min_test_strength is not None:
        rates = kill_rates or {}
        for r in rows:
            if r["reason"] is not None or not r.get("has_tests"):
                continue
            if r["prompt_id"] not in rates:
                r["reason"] = DropReason.weak_tests.of("not audited")
            elif (rate := rates[r["prompt_id"]]) is None or rate < spec.min_test_strength:
                r["reason"] = DropReason.weak_tests.of(f"{rate or 0:.2f}")

    if spec.max_pass_rate is not None:
        for group in by_prompt.values():
            plain = [r for r in group if not r["hinted"]] or group
            rate = sum(r["passed"] for r in plain) / len(plain)
            if rate > spec.max_pass_rate:
                for r in group:
                    r["reason"] = r["reason"] or DropReason.too_easy.value

    if eval_index is not None:
        alive = [r for r in rows if r["reason"] is None]
        prompt_text = {r["prompt_id"]: r["prompt"] or r["messages"] or "" for r in alive}
        pids = list(prompt_text)
        prompt_hits = dict(zip(pids, eval_index.match([prompt_text[p] for p in pids]), strict=True))
        text_hits = eval_index.match([r["text"] for r in alive])
        for r, hit in zip(alive, text_hits, strict=True):
            hit = prompt_hits[r["prompt_id"]] or hit
            if hit is not None:
                r["reason"] = DropReason.contaminated.of(hit)

    seen: dict[tuple, str] = {}
    for r in rows:
        if r["reason"] is None:
            key = (r["prompt_id"], normalised_hash(r["text"], spec.lowercase))
            if key in seen:
                r["reason"] = DropReason.duplicate_of.of(seen[key])
            else:
                seen[key] = r["candidate_id"]

    alive = [r for r in rows if r["reason"] is None]
    need_sigs = spec.near_dup or spec.policy == "diverse"
    if need_sigs and alive:
        from thresher.selection.minhash import near_duplicates, signatures

        sigs = signatures(
            [r["text"] for r in alive], spec.num_perm, spec.shingle_size, lowercase=spec.lowercase
        )
        for r, sig in zip(alive, sigs, strict=True):
            r["sig"] = sig
        if spec.near_dup:
            before = kept_before if spec.across_prompts else []
            all_sigs = np.vstack([*(s for _, s in before or []), sigs]) if before else sigs
            ids = [c for c, _ in before or []] + [r["candidate_id"] for r in alive]
            groups = ["*"] * len(ids) if spec.across_prompts else [r["prompt_id"] for r in alive]
            dups = near_duplicates(all_sigs, groups, spec.threshold)
            offset = len(before or [])
            for i, r in enumerate(alive):
                if dups[offset + i] is not None:
                    r["reason"] = DropReason.duplicate_of.of(ids[dups[offset + i]])

    for group in by_prompt.values():
        alive = [r for r in group if r["reason"] is None]
        if len(alive) <= spec.cap:
            continue
        for r in _rank(alive, spec)[spec.cap :]:
            r["reason"] = DropReason.capped.value

    if spec.answer_balance is not None:
        for task in sorted({r.get("task") or "" for r in rows}):
            part = [r for r in rows if (r.get("task") or "") == task]
            shares = (reference_shares or {}).get(task, {})
            balance_answers(part, shares, spec.answer_balance)

    if max_hinted_share is not None and max_hinted_share < 1:
        kept = [r for r in rows if r["reason"] is None]
        hinted = [r for r in kept if r["hinted"]]
        share = max_hinted_share
        allowed = int(share * (len(kept) - len(hinted)) / (1 - share) + 1e-9)
        for r in hinted[allowed:]:
            r["reason"] = DropReason.hint_share.value


def balance_answers(rows: list[dict], shares: dict[str, float], margin: float) -> None:
    """Drop kept rows of one task (reason `answer_share:<answer>`) until no final answer's
    share of what is kept exceeds its share in `shares` plus `margin` (one of each answer
    always stays); rows of the prompts with most kept rows go first, the last sampled of
    them first."""
    from collections import Counter

    from thresher.answers import answer_key

    kept = [r for r in rows if r["reason"] is None]
    keys = {id(r): answer_key(r.get("answer")) for r in kept}
    changed = True
    while changed:
        changed = False
        kept = [r for r in kept if r["reason"] is None]
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
    from collections import Counter, defaultdict

    from thresher.answers import answer_key

    per_task: dict[str, Counter] = defaultdict(Counter)
    for task, reference in references:
        key = answer_key(reference)
        if key is not None:
            per_task[task or ""][key] += 1
    return {
        task: {k: n / sum(counts.values()) for k, n in counts.items()}
        for task, counts in per_task.items()
    }


def _rank(alive: list[dict], spec: SelectConfig) -> list[dict]:
    """The prompt's surviving candidates, best first, unhinted before hinted."""
    out = []
    for hinted in (False, True):
        part = [r for r in alive if r["hinted"] == hinted]
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
    from thresher.stores.queries import selected_count, selection_inputs
    from thresher.stores.tables import write_selections

    used = plan.digests or None
    rows = selection_inputs(lake, candidate_ids, plan.rule, used, plan.ranking)
    if rows and selected_count(lake, plan.selection_id, candidate_ids) >= len(rows):
        return 0  # this batch was selected already
    kept_before = (
        _kept_signatures(lake, plan.selection_id, settings) if settings.across_prompts else None
    )
    kill_rates = None
    if settings.min_test_strength is not None:
        from thresher.stores.queries import prompt_kill_rates

        prompts = sorted({r["prompt_id"] for r in rows})
        kill_rates = prompt_kill_rates(lake, prompts, plan.tests_suite)
    shares = None
    if settings.answer_balance is not None and rows:
        from thresher.stores.queries import reference_answers

        refs = reference_answers(lake, sorted({r["prompt_id"] for r in rows}))
        shares = reference_shares(list(zip(refs["task"], refs["reference"], strict=True)))
    decide(rows, settings, kept_before, eval_index, plan.max_hinted_share, kill_rates, shares)
    return write_selections(lake, plan.selection_id, plan.round, rows, plan.run_id)


def _kept_signatures(lake: Lake, selection_id: str, spec: SelectConfig) -> list[tuple]:
    from thresher.selection.minhash import signatures
    from thresher.stores.queries import kept_texts

    kept = kept_texts(lake, selection_id)
    if kept.height == 0:
        return []
    sigs = signatures(
        kept["text"].to_list(), spec.num_perm, spec.shingle_size, lowercase=spec.lowercase
    )
    return list(zip(kept["candidate_id"].to_list(), sigs, strict=True))
