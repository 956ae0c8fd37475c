"""Vectorised MinHash signatures identical to datasketch's, and LSH near-duplicate grouping.

datasketch (2.x, default "affine32" scheme) hashes each shingle with SHA-1 (first four
bytes, little-endian), mixes it with MurmurHash3's 32-bit finaliser, and applies
permutations h -> a*h + b in uint32 arithmetic. Here every shingle of a whole batch is
hashed once (shared shingles once per batch), the permutations run as one numpy array
operation, and the per-text minimum is a single `minimum.reduceat`: the signatures equal
datasketch's bit for bit (a test checks), at a fraction of the cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=16)
def permutations(num_perm: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's permutation parameters (a, b) for `num_perm` and `seed`."""
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed).permutations
    return np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def shingles(text: str, size: int, lowercase: bool = False) -> list[str]:
    """Word shingles of `size` words (the whole text when it is shorter)."""
    words = (text.lower() if lowercase else text).split()
    if len(words) <= size:
        return [" ".join(words)]
    return [" ".join(words[i : i + size]) for i in range(len(words) - size + 1)]


def signatures(
    texts: Sequence[str],
    num_perm: int = 128,
    shingle_size: int = 5,
    seed: int = 1,
    lowercase: bool = False,
    chunk: int = 256,
) -> np.ndarray:
    """A (len(texts), num_perm) uint32 array of MinHash signatures, as datasketch's."""
    a, b = permutations(num_perm, seed)
    out = np.empty((len(texts), num_perm), dtype=np.uint32)
    if not len(texts):
        return out
    cache: dict[str, int] = {}
    sha1 = hashlib.sha1
    for start in range(0, len(texts), chunk):
        docs = [shingles(t, shingle_size, lowercase) for t in texts[start : start + chunk]]
        values = []
        for doc in docs:
            for s in doc:
                h = cache.get(s)
                if h is None:
                    h = cache[s] = int.from_bytes(sha1(s.encode()).digest()[:4], "little")
                values.append(h)
        hv = _fmix32(np.fromiter(values, dtype=np.uint32, count=len(values)))
        phv = hv[:, None] * a[None, :] + b[None, :]  # uint32 wraparound, as datasketch
        offsets = np.cumsum([0] + [len(d) for d in docs[:-1]])
        out[start : start + len(docs)] = np.minimum.reduceat(phv, offsets, axis=0)
        if len(cache) > 2_000_000:
            cache.clear()
    return out


@lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) that datasketch's MinHashLSH picks for this threshold."""
    from datasketch.lsh import _optimal_param

    return _optimal_param(threshold, num_perm, 0.5, 0.5)


def near_duplicates(
    sigs: np.ndarray, groups: Sequence[object], threshold: float = 0.8
) -> list[int | None]:
    """For each row in order, the earlier kept row it collides with in LSH, else None.

    Rows are compared only within their group (e.g. a prompt). Greedy, like inserting
    into datasketch's MinHashLSH after querying it: a row whose bands collide with a kept
    row's is a duplicate of the first such row and is not inserted itself.
    """
    bands, rows = lsh_params(threshold, sigs.shape[1])
    tables: list[dict] = [{} for _ in range(bands)]
    out: list[int | None] = []
    keys = [[sig[i * rows : (i + 1) * rows].tobytes() for i in range(bands)] for sig in sigs]
    for idx, (group, band_keys) in enumerate(zip(groups, keys, strict=True)):
        hit = None
        for table, key in zip(tables, band_keys, strict=True):
            found = table.get((group, key))
            if found is not None and (hit is None or found < hit):
                hit = found
        out.append(hit)
        if hit is None:
            for table, key in zip(tables, band_keys, strict=True):
                table.setdefault((group, key), idx)
    return out


def jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two signatures."""
    return float(np.mean(sig_a == sig_b))
