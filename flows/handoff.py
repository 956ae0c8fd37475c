"""Exports that leave thresher: a round's SFT or DPO data, or the prompts in a pass-rate band
for an RL trainer, each with its dataset card; and the push of an export to the Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thresher.config import DecontamConfig
from thresher.selection.stage import eval_index
from thresher.stores.card import provenance, save_card
from thresher.stores.export import (
    band_prompts,
    band_sql_text,
    export_round,
    kept_sql_text,
    latest_model,
    measured_prompts,
    model_settings,
    pass_rate_runs,
    rl_rows,
    save_rl,
)
from thresher.stores.lake import Lake
from thresher.verifiers import EVAL_VERIFIERS, traits, verifier_name


def _verifier_versions(verify_sections: list[dict | None]) -> dict[str, int]:
    names = {n for v in verify_sections if v for n in (v.get("verifiers") or [])}
    for v in verify_sections:
        for by_task in ((v or {}).get("by_task") or {}).values():
            names |= set(by_task)
    out = {}
    for n in sorted(names):
        try:
            out[verifier_name(n)] = traits(n)["version"]
        except (KeyError, ValueError, ImportError):  # a plugin not installed here
            out[n] = -1
    return out


def _rl_verify(verify: dict) -> dict:
    """The verify section an RL export hands on: the recorded one (EVAL_VERIFIERS when no
    run recorded verifiers)."""
    return {**verify, "verifiers": verify.get("verifiers") or list(EVAL_VERIFIERS)}


def _rows(to: Path) -> list[dict]:
    with open(to / "data.jsonl") as f:
        return [json.loads(line) for line in f]


def export_data(
    lake: Lake,
    round_: int,
    fmt: str,
    to: Path,
    all_rounds: bool = False,
    name: str | None = None,
    license_: str | None = None,
) -> int:
    """A round's SFT or DPO data (stores.export), then its card; returns the rows."""
    n = export_round(lake, round_, fmt, to, all_rounds, name)
    rows = _rows(to)
    ids = sorted({r.get("candidate_id") or r.get("chosen_id") for r in rows} - {None})
    ids += sorted({r["rejected_id"] for r in rows if r.get("rejected_id")})
    info = provenance(
        lake, fmt, n, sorted({r["prompt_id"] for r in rows}), ids,
        kept_sql_text(round_, all_rounds, name), {},
        rounds=list(range(round_ + 1)) if all_rounds else [round_], name=name,
        license_=license_,
    )  # fmt: skip
    info["verifiers"] = _verifier_versions([r["verify"] for r in info["runs"]])
    title = f"{name or 'thresher'} round {round_} {fmt}"
    save_card(to, info, "data.jsonl", title)
    return n


def export_rl(
    lake: Lake,
    to: Path,
    model: str | None = None,
    low: float = 0.2,
    high: float = 0.8,
    license_: str | None = None,
) -> dict[str, Any]:
    """The training prompts `model` (default: the latest) solves between `low` and `high`
    of the time, less any that overlap an eval or test prompt, in verl's and TRL's layouts,
    with the card; returns counts and paths."""
    model = model or latest_model(lake)
    if model is None:
        raise ValueError(f"{lake.root} has no sampled candidates: no model has pass rates yet")
    prompts = band_prompts(lake, model, low, high)
    verify, decontam = model_settings(lake, model)
    # the pipeline's own decontamination settings (exact matching for templated tasks),
    # always on: eval items never go to a trainer. The semantic check is selection's
    # rule only (index.match is n-gram and MinHash): building its index here would embed
    # every eval item for nothing
    settings = DecontamConfig(**{**(decontam or {}), "enabled": True, "semantic": None})
    index = eval_index(lake, settings)
    texts = [p["prompt"] or p["messages"] or "" for p in prompts]
    hits = index.match(texts) if index is not None and prompts else [None] * len(prompts)
    kept = [p for p, hit in zip(prompts, hits, strict=True) if hit is None]
    if not kept:
        raise ValueError(
            f"no training prompt of model {model!r} has a pass rate in [{low}, {high}]"
            + (f" ({len(prompts)} did, all overlapping an eval prompt)" if prompts else "")
        )
    paths = save_rl(rl_rows(kept, model, _rl_verify(verify)), to)
    overlaps = len(prompts) - len(kept)
    # an RL export's funnel: prompts measured, in the band, overlapping an eval, written
    funnel = {"measured": measured_prompts(lake, model), "in_band": len(prompts),
              "contaminated": overlaps, "rows": len(kept)}  # fmt: skip
    info = provenance(
        lake, "rl", len(kept), [p["prompt_id"] for p in kept], [],
        band_sql_text(model, low, high), _verifier_versions([verify]),
        runs=pass_rate_runs(lake, model),
        extra={"band": {"model": model, "low": low, "high": high, "in_band": len(prompts),
                        "contaminated": overlaps}, "funnel": [funnel]},
        license_=license_,
    )  # fmt: skip
    info["decontamination"] = {
        "enabled": True,
        "eval_datasets": settings.eval_datasets or info["decontamination"]["eval_datasets"],
        "files": settings.files,
        "ngram": None if settings.exact else settings.ngram,
    }
    save_card(to, info, "train.parquet", f"thresher RL prompts of {model}")
    return {"model": model, "rows": len(kept), "contaminated": overlaps, **paths}


def push_to_hub(to: Path, repo: str, fmt: str, private: bool = False) -> str:
    """Push an export folder to a Hub dataset repo through `datasets` (its data), then its
    card (README.md); returns the repo's URL."""
    import datasets
    from huggingface_hub import HfApi

    if fmt == "rl":
        data = datasets.load_from_disk(str(to / "trl"))
    else:
        data = datasets.load_from_disk(str(to))
    data.push_to_hub(repo, private=private)
    api = HfApi()
    files = [*(["train.parquet"] if fmt == "rl" else ["data.jsonl"]), "README.md"]
    for name in files:  # the card last: it replaces the one `datasets` wrote
        api.upload_file(path_or_fileobj=str(to / name), path_in_repo=name, repo_id=repo,
                        repo_type="dataset")  # fmt: skip
    return f"https://huggingface.co/datasets/{repo}"
