"""Decontamination: find training prompts or answers that overlap evaluation items."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thresher.answers import answer_key
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
    semantic: SemanticIndex | None = None  # reworded items (select.decontaminate.semantic)

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


# -- reworded items: close in meaning, and the evidence agrees ---------------------------

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?")
_QUOTED = re.compile(r"[\"“]([^\"”]{1,80})[\"”]|(?<!\w)'([^']{1,80})'(?!\w)")


def numbers(text: str) -> tuple[str, ...]:
    """The numbers in a text, as a sorted multiset of their values ("1,000" is "1000")."""
    return tuple(sorted(answer_key(m) or m for m in _NUMBER.findall(text or "")))


def quoted(text: str) -> tuple[str, ...]:
    """The quoted strings in a text (lower-cased, sorted, each once): the words a letter is
    counted in, a name asked about."""
    found = {(a or b).strip().lower() for a, b in _QUOTED.findall(text or "")}
    return tuple(sorted(found - {""}))


def agreement(
    text: str, other: str, reference: str | None, other_reference: str | None,
    similarity: float, same_answer_similarity: float,
) -> str | None:  # fmt: skip
    """What two texts close in meaning agree on, making one the other reworded ("numbers
    4 5", "quoted ...", "answer 9"), or None: their references differ, their numbers or
    quoted strings differ, or neither holds any and they are not alike enough to count on
    a shared answer alone."""
    key, other_key = answer_key(reference), answer_key(other_reference)
    if key is not None and other_key is not None and key != other_key:
        return None
    nums, other_nums = numbers(text), numbers(other)
    if nums or other_nums:
        return f"numbers {' '.join(nums)}" if nums == other_nums else None
    names, other_names = quoted(text), quoted(other)
    if names or other_names:
        return f"quoted {' | '.join(names)}" if names == other_names else None
    if key is not None and key == other_key and similarity >= same_answer_similarity:
        return f"answer {key}"
    return None


def nearest(
    queries: np.ndarray, items: np.ndarray, n: int, block: int = 8192
) -> tuple[np.ndarray, np.ndarray]:
    """The `n` items most similar to each query (unit vectors: cosine = dot product), as
    (indices, similarities), best first: an exact search in blocks of items, so memory
    stays at queries x block."""
    m = len(queries)
    n = min(n, len(items))
    best_i = np.zeros((m, 0), dtype=np.int64)
    best_s = np.zeros((m, 0), dtype=np.float32)
    for start in range(0, len(items), block):
        sims = queries @ items[start : start + block].T
        take = min(n, sims.shape[1])
        part = np.argpartition(-sims, take - 1, axis=1)[:, :take]
        cand_s = np.concatenate([best_s, np.take_along_axis(sims, part, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, part + start], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :n]
        best_s = np.take_along_axis(cand_s, order, axis=1)
        best_i = np.take_along_axis(cand_i, order, axis=1)
    return best_i, best_s


@dataclass
class SemanticIndex:
    """Evaluation items by sentence embedding, with what a reworded copy must agree on."""

    ids: list[str]
    texts: list[str]
    references: list[str | None]
    vectors: np.ndarray  # unit length, one row per item
    embed: Callable[[list[str]], np.ndarray]  # texts -> unit vectors, same model
    min_similarity: float = 0.6
    same_answer_similarity: float = 0.9
    neighbours: int = 20

    def match(self, texts: list[str], references: list[str | None]) -> list[dict | None]:
        """For each text, the evidence that it rewords an evaluation item (eval_prompt_id,
        similarity, agreed), else None."""
        out: list[dict | None] = [None] * len(texts)
        if not texts or not self.ids:
            return out
        idx, sims = nearest(self.embed(texts), self.vectors, self.neighbours)
        for q, text in enumerate(texts):
            for j, sim in zip(idx[q], sims[q], strict=True):
                if sim < self.min_similarity:
                    break
                agreed = agreement(
                    text, self.texts[j], references[q], self.references[j],
                    float(sim), self.same_answer_similarity,
                )  # fmt: skip
                if agreed is not None:
                    out[q] = {"eval_prompt_id": self.ids[j], "similarity": round(float(sim), 4),
                              "agreed": agreed}  # fmt: skip
                    break
        return out
