"""Decontamination: find training prompts or answers that overlap evaluation items."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thresher.selection.minhash import signatures

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Lower-cased words and symbols (spacing and case do not hide a match; "+" is not "*")."""
    return _WORD.findall(text.lower())


def ngram_keys(text: str, n: int | None) -> set[bytes]:
    """Hashed word n-grams of `text`; a text shorter than n words (any text, when n is None)
    is one key, whole."""
    toks = words(text)
    if not toks:
        return set()
    if n is None or len(toks) < n:
        grams = [" ".join(toks)]
    else:
        grams = [" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    return {hashlib.blake2b(g.encode(), digest_size=8).digest() for g in grams}


@dataclass
class EvalIndex:
    """Evaluation items indexed by word n-grams, or whole when n is None (and optionally
    MinHash signatures)."""

    n: int | None = 13
    minhash_threshold: float | None = None
    grams: dict[bytes, str] = field(default_factory=dict)  # n-gram -> eval item id
    ids: list[str] = field(default_factory=list)
    sigs: np.ndarray | None = None

    def add(self, items: Iterable[tuple[str, str]]) -> EvalIndex:
        """Index (item id, text) pairs."""
        items = list(items)
        for item_id, text in items:
            for key in ngram_keys(text, self.n):
                self.grams.setdefault(key, item_id)
        if self.minhash_threshold is not None and items:
            sigs = signatures([t for _, t in items], shingle_size=self._shingle, lowercase=True)
            self.sigs = sigs if self.sigs is None else np.vstack([self.sigs, sigs])
            self.ids += [i for i, _ in items]
        return self

    @property
    def _shingle(self) -> int:
        return min(self.n or 5, 5)

    def __len__(self) -> int:
        return len(self.grams)

    def match(self, texts: list[str]) -> list[str | None]:
        """For each text, the id of an eval item it overlaps, else None."""
        out: list[str | None] = []
        for text in texts:
            hit = None
            for key in ngram_keys(text, self.n):
                hit = self.grams.get(key)
                if hit is not None:
                    break
            out.append(hit)
        if self.sigs is not None and any(h is None for h in out):
            todo = [i for i, h in enumerate(out) if h is None]
            sigs = signatures([texts[i] for i in todo], shingle_size=self._shingle, lowercase=True)
            for i, sig in zip(todo, sigs, strict=True):
                sim = (self.sigs == sig).mean(axis=1)
                best = int(sim.argmax())
                if sim[best] >= self.minhash_threshold:
                    out[i] = self.ids[best]
        return out


def file_items(path: str | Path) -> list[tuple[str, str]]:
    """(id, text) items of an extra contamination file: JSONL rows or plain text lines.

    From a JSON row, every string field (prompt, question, answer, ...) counts.
    """
    path = Path(path)
    items = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = line
            if isinstance(row, dict):
                text = "\n".join(v for v in row.values() if isinstance(v, str))
            elif isinstance(row, str):
                text = row
            else:
                continue
            items.append((f"{path.name}:{line_no}", text))
    return items
