"""Near-duplicate removal: thresher's vectorised MinHash + LSH against a plain datasketch loop.

A synthetic corpus of candidates (about 200 words each, 8 per prompt) with planted
near-duplicates (a solution with a few words changed) is deduplicated within each
prompt twice: by thresher (`stores.minhash`) and by the obvious datasketch code
(`MinHash.update` per shingle, one `MinHashLSH` per prompt, query then insert). Prints
`dedup speedup: X` (datasketch time / thresher time) and `agreement: Y` (the fraction
of candidates given the same keep/drop decision).

    .venv/bin/python bench/dedup.py [--candidates 20000] [--threshold 0.8]
"""

from __future__ import annotations

import random
import time

from shared import options


def corpus(n: int, per_prompt: int = 8, words: int = 200, seed: int = 0):
    """(prompt ids, texts): per prompt a few distinct solutions and near copies of them."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    prompt_ids, texts = [], []
    for p in range(n // per_prompt):
        originals = []
        for _ in range(per_prompt):
            if originals and rng.random() < 0.6:  # a near copy: two words renamed/reworded
                base = rng.choice(originals).split()
                for _ in range(2):
                    base[rng.randrange(len(base))] = rng.choice(vocab)
                text = " ".join(base)
            else:
                text = " ".join(rng.choice(vocab) for _ in range(words))
                originals.append(text)
            prompt_ids.append(f"p{p}")
            texts.append(text)
    return prompt_ids, texts


def datasketch_dedup(prompt_ids, texts, threshold, num_perm, shingle_size) -> list[bool]:
    from datasketch import MinHash, MinHashLSH

    from thresher.selection.minhash import shingles

    keep, indexes = [], {}
    for i, (pid, text) in enumerate(zip(prompt_ids, texts, strict=True)):
        m = MinHash(num_perm=num_perm)
        for s in shingles(text, shingle_size):
            m.update(s.encode())
        lsh = indexes.setdefault(pid, MinHashLSH(threshold=threshold, num_perm=num_perm))
        if lsh.query(m):
            keep.append(False)
        else:
            lsh.insert(str(i), m)
            keep.append(True)
    return keep


def thresher_dedup(prompt_ids, texts, threshold, num_perm, shingle_size) -> list[bool]:
    from thresher.selection.minhash import near_duplicates, signatures

    sigs = signatures(texts, num_perm=num_perm, shingle_size=shingle_size)
    return [d is None for d in near_duplicates(sigs, prompt_ids, threshold)]


def main() -> None:
    parser = options(__doc__, candidates=20000, threshold=0.8, num_perm=128, shingle_size=5)
    args = parser.parse_args()
    prompt_ids, texts = corpus(args.candidates)
    params = (args.threshold, args.num_perm, args.shingle_size)

    thresher_dedup(prompt_ids[:100], texts[:100], *params)  # imports and caches warm up
    start = time.perf_counter()
    ours = thresher_dedup(prompt_ids, texts, *params)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    theirs = datasketch_dedup(prompt_ids, texts, *params)
    t_theirs = time.perf_counter() - start

    n = len(texts)
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True)) / n
    print(
        f"{n} candidates of about 200 words, {n // 8} prompts, threshold {args.threshold}, "
        f"{args.num_perm} permutations, {args.shingle_size}-word shingles"
    )
    print(f"thresher: {t_ours:.2f} s ({n / t_ours:.0f} candidates/s), kept {sum(ours)}")
    print(
        f"datasketch loop: {t_theirs:.2f} s ({n / t_theirs:.0f} candidates/s), kept {sum(theirs)}"
    )
    print(f"dedup speedup: {t_theirs / t_ours:.1f}")
    print(f"agreement: {agree:.4f}")


if __name__ == "__main__":
    main()
