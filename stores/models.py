"""Where a pipeline's models live beside its lake: one folder per round, and the pointer to
the round whose model scored best on held-out pass@1 (`best.json`)."""

from __future__ import annotations

import json
from pathlib import Path

from thresher.stores.lake import Lake


def model_dir_for(lake: Lake, name: str, round_: int) -> Path:
    """Where round `round_`'s model of pipeline `name` lives: <lake>/models/<name>/round-N,
    or ./models/<name>/round-N when the lake is remote (training needs a local folder)."""
    return lake.local_dir("models", name, f"round-{round_}")


def model_path(lake: Lake, name: str, base_model: str, round_: int) -> str:
    """Model r's folder: the base model for round 0, else what round r-1 trained."""
    if round_ == 0:
        return base_model
    return str(model_dir_for(lake, name, round_) / "model")


def set_best_pointer(lake: Lake, name: str, best_round: int, model: str) -> None:
    """<models>/<name>/best.json: which round's model is the best on held-out pass@1."""
    folder = model_dir_for(lake, name, 0).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "best.json").write_text(json.dumps({"round": best_round, "model": model}) + "\n")


def read_best_pointer(lake: Lake, name: str) -> dict | None:
    """best.json of bootstrap `name` ({round, model}), or None when it has none."""
    path = model_dir_for(lake, name, 0).parent / "best.json"
    return json.loads(path.read_text()) if path.exists() else None
