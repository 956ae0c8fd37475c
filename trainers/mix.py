"""Training mixtures (`train.mix`): rows from weighted sources, each source's share met to
within one row (largest remainder), picked by a seeded shuffle."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from thresher.config import MixSource, TrainConfig
from thresher.stores.export import latest_kept_round, reference_rows, sft_rows
from thresher.stores.lake import Lake
from thresher.trainers.stage import load_rows


class MixError(ValueError):
    """A mixture that cannot be built as configured (an empty or too small source)."""


def shares(weights: list[float]) -> list[Fraction]:
    """Each weight over the sum of the weights, exactly."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    return [w / total for w in exact]


def allocate(weights: list[float], total: int) -> list[int]:
    """Rows per source for `total` rows: largest remainder (Hamilton), so the counts sum to
    `total` exactly and each is within one row of total * its share (ties go to the
    earlier source)."""
    quotas = [total * s for s in shares(weights)]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: (counts[i] - quotas[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def mix_total(weights: list[float], available: list[int], self_index: int | None) -> int:
    """The mixture's size when `mix_rows` is not given: all of the self source's rows over
    its share (rounded down, so they are never repeated), else the most rows for which no
    source needs repeating."""
    parts = shares(weights)
    if self_index is not None:
        return math.floor(available[self_index] / parts[self_index])
    return min(math.floor(n / s) for n, s in zip(available, parts, strict=True))


def pick(rows: list[dict], count: int, seed: str) -> list[dict]:
    """`count` rows by a seeded shuffle of `rows`; past the end the same order repeats, so
    each row is used either k or k+1 times."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[order[i % len(rows)]] for i in range(count)]


def source_rows(
    cfg: TrainConfig, lake: Lake, src: MixSource, ingested: dict[str, list[str]]
) -> tuple[list[dict[str, Any]], int]:
    """One source's SFT rows (before mixing) and how many of its prompts lacked a response."""
    if src.is_self:
        if src.rounds is not None:
            data = cfg.data.model_copy(update={"all_rounds": src.rounds == "all"})
            cfg = cfg.model_copy(update={"data": data})
        return load_rows(cfg, lake), 0
    if src.pipeline is not None:
        latest = latest_kept_round(lake, src.pipeline)
        if latest is None:
            return [], 0
        return sft_rows(lake, latest, src.rounds != "latest", src.pipeline), 0
    if src.path is not None:
        return reference_rows(lake, src.dataset_name, "answer", ingested[src.path])
    return reference_rows(lake, src.dataset, src.response)


def screened(
    rows: list[dict[str, Any]], match: Callable[[list[str]], list[str | None]] | None
) -> tuple[list[dict[str, Any]], int]:
    """`rows` less those whose prompt or response overlaps an evaluation item (`match`
    gives each text's overlapping item, else None), and how many were dropped."""
    if match is None or not rows:
        return rows, 0
    hits = match([f"{r.get('prompt') or ''}\n{r.get('completion') or ''}" for r in rows])
    kept = [r for r, hit in zip(rows, hits, strict=True) if hit is None]
    return kept, len(rows) - len(kept)


def mixed_rows(
    cfg: TrainConfig,
    lake: Lake,
    ingested: dict[str, list[str]] | None = None,
    match: Callable[[list[str]], list[str | None]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of `cfg.mix` (each tagged with its `mix_source`), and per source what was
    used: weight, share, rows available, rows used, their share, repeats, prompts without
    a response, rows dropped as contaminated. `ingested` maps each path source to the
    prompt ids its file holds; `match` (the decontamination index's) screens the sources
    that did not come through selection (datasets and files)."""
    assert cfg.mix, "mixed_rows needs a config with a mix"
    ingested = ingested or {}
    sources = cfg.mix
    weights = [s.weight for s in sources]
    loaded, contaminated = [], []
    for src in sources:
        rows, missing = source_rows(cfg, lake, src, ingested)
        rows, dropped = screened(rows, match if src.outside_selection else None)
        loaded.append((rows, missing))
        contaminated.append(dropped)
    available = [len(rows) for rows, _ in loaded]
    for src, n, (_, missing) in zip(sources, available, loaded, strict=True):
        if n == 0:
            why = f" ({missing} prompts have no response)" if missing else ""
            raise MixError(f"mix source {src.label} has no rows{why}")
    self_index = next((i for i, s in enumerate(sources) if s.is_self), None)
    total = cfg.mix_rows or mix_total(weights, available, self_index)
    if total < 1:
        raise MixError("the mix comes to no rows: set mix_rows, or add rows to its sources")
    counts = allocate(weights, total)
    parts = shares(weights)
    out: list[dict[str, Any]] = []
    record = []
    for src, (rows, missing), n, count, share, dropped in zip(
        sources, loaded, available, counts, parts, contaminated, strict=True
    ):
        if count > n and src.on_short == "refuse":
            raise MixError(
                f"mix source {src.label} has {n} rows; its share ({float(share):.2%} of "
                f"{total}) needs {count}: add rows, lower its weight, set mix_rows, or set "
                "on_short: repeat"
            )
        out += [
            {**row, "mix_source": src.label} for row in pick(rows, count, f"{cfg.seed}:{src.label}")
        ]
        record.append(
            {
                "source": src.label,
                "weight": src.weight,
                "share": round(float(share), 6),
                "available": n,
                "rows": count,
                "row_share": round(count / total, 6),
                "repeated": max(0, count - n),
                "on_short": src.on_short,
                "no_response": missing,
                "contaminated": dropped,
            }
        )
    return out, record
