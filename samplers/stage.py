"""The sampling stage: sample what a batch of prompts is missing, and STaR rationalization.

Candidate ids are content hashes, computed once per batch here: they say what exists, what
to sample, and which candidates the batch's later stages (verify, select) read."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from thresher.config import CurateConfig
from thresher.ids import content_id
from thresher.plan import RoundPlan
from thresher.samplers import candidate_rows, expected_ids, sampling_params
from thresher.stores.lake import Lake


@dataclass
class Sampled:
    """One batch's sampling: the ids of all its candidates (existing or new), how many
    were written now and the seconds spent sampling them."""

    ids: list[str] = field(default_factory=list)
    written: int = 0
    seconds: float = 0.0


def batches_in_flight(cfg: CurateConfig) -> int:
    """How many batches to keep sampling at once (the config's sampler says)."""
    from thresher.samplers.engines import sampler_for

    return sampler_for(cfg).in_flight


def run_stats(cfg: CurateConfig) -> dict:
    """Where the run sampled, for its summary."""
    from thresher.samplers.engines import sampler_for

    return sampler_for(cfg).stats()


def sampling_plan(
    lake: Lake, cfg: CurateConfig, prompt_ids: list[str], retired: set[str] | None = None
) -> dict[str, int]:
    """prompt_id -> candidates to sample this round (0: skipped as solved, or retired), from
    the pass rates this pipeline measured in its latest earlier round."""
    from thresher.samplers.difficulty import plan_k
    from thresher.stores.queries import last_pass_rates

    band = cfg.difficulty
    retired = retired_prompts(lake, cfg) if retired is None else retired
    if cfg.round == 0 or (band.skip_solved_above is None and band.hard_below is None):
        plan = dict.fromkeys(prompt_ids, cfg.sampling.k)
    else:
        rates = last_pass_rates(lake, cfg.name, cfg.round)
        k = cfg.sampling.k
        plan = plan_k(prompt_ids, k, rates, band.skip_solved_above, band.hard_below, band.hard_k)
    return plan | {p: 0 for p in retired if p in plan}


def retired_prompts(lake: Lake, cfg: CurateConfig) -> set[str]:
    """Prompts this pipeline stops sampling: no passing candidate in `retire_after` rounds
    in a row (they carry no signal and would be resampled forever)."""
    from thresher.stores.queries import retired_prompts as streaks

    after = cfg.difficulty.retire_after
    if after is None or cfg.round < after:
        return set()
    return streaks(lake, cfg.name, cfg.round, after)


def sample_batch(
    lake: Lake,
    cfg: CurateConfig,
    run_id: str,
    batch: list[dict],
    ks: dict[str, int] | None = None,
    before_engine: Callable[[], None] | None = None,
) -> Sampled:
    """Sample the candidates of `batch` not in the lake yet: indices 0..k-1 of each prompt
    (k, or `ks[prompt_id]`); raising k samples only the new indices."""
    ks = ks or {p["prompt_id"]: cfg.sampling.k for p in batch}
    batch_id = content_id("batch", run_id, [p["prompt_id"] for p in batch])
    return _sample_missing(
        lake, cfg, run_id, batch, ks, sampling_params(cfg), batch_id, False, before_engine
    )


def rationalize_batch(
    lake: Lake,
    cfg: CurateConfig,
    plan: RoundPlan,
    batch: list[dict],
    candidate_ids: list[str],
    before_engine: Callable[[], None] | None = None,
) -> Sampled:
    """Sample the batch's unsolved prompts (no passing candidate among `candidate_ids`
    under the plan's rule and verdicts) again with the reference answer as a hint."""
    from thresher.samplers.difficulty import hinted_prompt
    from thresher.stores.queries import unsolved_prompts

    hints = cfg.rationalize
    unsolved = set(unsolved_prompts(lake, candidate_ids, plan.rule, plan.digests))
    run_id = plan.run_id
    todo = []
    for p in batch:
        if p["prompt_id"] in unsolved and p.get("answer") is not None:
            messages = json.loads(p["messages"]) if p["messages"] else None
            prompt, msgs = hinted_prompt(hints.hint, p["prompt"], messages, p["answer"])
            todo.append({**p, "prompt": prompt, "messages": json.dumps(msgs) if msgs else None})
    if not todo:
        return Sampled()
    params = {**sampling_params(cfg), "hint": hints.hint}
    batch_id = content_id("hinted-batch", run_id, [p["prompt_id"] for p in todo])
    ks = {p["prompt_id"]: hints.k for p in todo}
    return _sample_missing(lake, cfg, run_id, todo, ks, params, batch_id, True, before_engine)


def _sample_missing(
    lake: Lake,
    cfg: CurateConfig,
    run_id: str,
    batch: list[dict],
    ks: dict[str, int],
    params: dict,
    batch_id: str,
    hinted: bool,
    before_engine: Callable[[], None] | None,
) -> Sampled:
    from thresher.stores.queries import existing_candidates
    from thresher.stores.tables import write_candidates

    expected = {
        p["prompt_id"]: expected_ids(
            [p["prompt_id"]], cfg.model_id, cfg.round, ks[p["prompt_id"]], params
        )
        for p in batch
    }
    every = [c for ids in expected.values() for c in ids]
    have = existing_candidates(lake, every)
    # raising k samples only the new indices; lowering it reads the first k
    missing = {
        pid: [i for i, c in enumerate(ids) if c not in have] for pid, ids in expected.items()
    }
    todo = [p for p in batch if missing[p["prompt_id"]]]
    done = Sampled(ids=every)
    if not todo:
        return done
    from thresher.samplers.engines import sampler_for

    # starts the engine on first use (holding the device slot): not counted as sampling time
    sampler = sampler_for(cfg, before_engine=before_engine)
    for n in sorted({len(missing[p["prompt_id"]]) for p in todo}):
        group = [p for p in todo if len(missing[p["prompt_id"]]) == n]
        start = time.perf_counter()
        completions = sampler.sample(
            [p["prompt"] for p in group], [p["messages"] for p in group], n
        )
        done.seconds += time.perf_counter() - start
        indices = [missing[p["prompt_id"]] for p in group]
        rows = candidate_rows(
            [p["prompt_id"] for p in group],
            completions,
            model=cfg.model_id,
            round_=cfg.round,
            run_id=run_id,
            batch_id=batch_id,
            params=params,
            hinted=hinted,
            indices=indices,
            ids=[
                [expected[p["prompt_id"]][i] for i in idxs]
                for p, idxs in zip(group, indices, strict=True)
            ],
        )
        done.written += write_candidates(lake, rows)
    return done
