"""The embedding step against sentence-transformers' own `encode`, and the nearest-neighbour
search at the size of a large evaluation set.

1. Throughput: thresher's embedding step (hash the texts, look them up in the lake, encode
   the missing ones in batches, store them) on a fresh lake, against `SentenceTransformer.
   encode` of the same texts with the same model and batch size, alternating, `--repeats`
   times each. Prints texts/s of both and the ratio (thresher / encode) of their medians.
2. Search: `selection.decontam.nearest` (exact: unit vectors, a blocked matrix product,
   the top `neighbours` kept per block) for `--queries` prompts against random unit
   vectors standing in for 10,000 and 100,000 evaluation items: prints the time and pairs
   compared per second, and checks the result against a full sort on the smaller size.

    python bench/embeddings.py [--texts 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def texts(n: int) -> list[str]:
    """`n` distinct prompts to embed: the bundled word problems, then reasoning-gym
    questions."""
    out = [json.loads(line)["prompt"] for line in open(ROOT / "examples/word-problems/train.jsonl")]
    import reasoning_gym

    seed = 0
    while len(set(out)) < n:
        for task in ("basic_arithmetic", "chain_sum", "gcd", "letter_counting"):
            out += [e["question"] for e in reasoning_gym.create_dataset(task, size=100, seed=seed)]
        seed += 1
    return list(dict.fromkeys(out))[:n]  # distinct: the step would embed a repeat once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=1000)
    args = ap.parse_args()

    import numpy as np

    from thresher.config import SemanticConfig
    from thresher.embeddings import load
    from thresher.selection.decontam import nearest
    from thresher.selection.stage import embed_texts as embeddings
    from thresher.stores.lake import Lake

    cfg = SemanticConfig()
    sample = texts(args.texts)
    model = load(cfg.model)
    model.encode(sample[:64], batch_size=cfg.batch_size)  # warm up
    ours, theirs = [], []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        model.encode(sample, batch_size=cfg.batch_size, normalize_embeddings=True)
        theirs.append(len(sample) / (time.perf_counter() - t0))
        with tempfile.TemporaryDirectory() as tmp:
            lake = Lake(Path(tmp) / "lake")
            lake.init()
            t0 = time.perf_counter()
            embeddings(lake, sample, cfg.model, cfg.batch_size)
            ours.append(len(sample) / (time.perf_counter() - t0))
        print(f"repeat {r}: encode {theirs[-1]:.1f} texts/s, thresher {ours[-1]:.1f} texts/s")
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"embedding {len(sample)} texts ({cfg.model}, batch {cfg.batch_size}): "
          f"sentence-transformers encode {statistics.median(theirs):.1f} texts/s, "
          f"thresher {statistics.median(ours):.1f} texts/s; ratio {ratio:.3f}")  # fmt: skip

    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:
        v = rng.normal(size=(n, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    queries = unit(args.queries)
    for n_items in (10_000, 100_000):
        items = unit(n_items)
        t0 = time.perf_counter()
        idx, _ = nearest(queries, items, cfg.neighbours)
        seconds = time.perf_counter() - t0
        if n_items == 10_000:
            full = np.argsort(-(queries @ items.T), axis=1)[:, : cfg.neighbours]
            assert (idx == full).all(), "blocked search disagrees with a full sort"
        rate = args.queries * n_items / seconds / 1e6
        print(f"nearest {cfg.neighbours} of {n_items:,} items for {args.queries:,} prompts: "
              f"{seconds:.2f} s, {rate:.0f} M pairs/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
