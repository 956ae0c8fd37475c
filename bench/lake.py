"""Does an append cost the same at ten million candidates as at ten thousand?

Appends BATCHES batches of ROWS candidate rows (answer texts of realistic length) and as
many selection rows through `Lake.append`, one commit each, the way curate writes them,
then prints `append growth: X` (median of the last 100 candidate appends over the median
of the first 100; goal <= 1.5), the total append time, and how long `count(*)`, the
`funnel` view and a group-by-prompt query take at full size before and after
`thresher compact` (goal: funnel <= 2 s after compaction).

    python bench/lake.py                      # 10,000 x 1,000 rows (10 M), ~20 min here
    python bench/lake.py --batches 500        # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from thresher.stores.lake import Lake
from thresher.stores.maintenance import compact
from thresher.stores.runs import record_run

WORDS = (
    "the of and to in is that for it as with was on be by this are we an or from at which "
    "so if then therefore answer total each number equals step first second next multiply "
    "add subtract divide sum result because since let find value gives minus plus times "
    "half twice remaining left more less than per hour day cost price apples dollars"
).split()
K = 8  # samples per prompt
ROUND_BATCHES = 1000  # batches per curate round (each round: one run, one selection)


def text_pool(n: int, rng: np.random.Generator) -> list[str]:
    """Answer-like texts: 20-400 words (lognormal, ~110 on average, ~600 characters)."""
    lengths = np.clip(rng.lognormal(4.5, 0.6, n), 20, 400).astype(int)
    words = np.array(WORDS)
    return [
        " ".join(words[rng.integers(0, len(words), size=m)]) + f" The answer is {i % 997}."
        for i, m in enumerate(lengths)
    ]


def batch_rows(b: int, rows: int, pool: list[str], rng: np.random.Generator):
    round_ = b // ROUND_BATCHES
    picks = rng.integers(0, len(pool), size=rows)
    stamp = datetime.now(UTC)
    candidates, selections = [], []
    for j in range(rows):
        prompt = f"p{b * rows // K + j // K:09d}"
        cid = f"c{b:05d}{j:04d}"
        text = pool[picks[j]]
        candidates.append(
            {
                "candidate_id": cid,
                "prompt_id": prompt,
                "run_id": f"run-{round_}",
                "round": round_,
                "model": "bench-model",
                "sample_idx": j % K,
                "text": text,
                "n_tokens": len(text) // 4,
                "finish_reason": "stop",
                "hinted": False,
                "batch_id": f"b{b}",
                "created_at": stamp,
            }
        )
        passed = picks[j] % 3 != 0
        kept = passed and j % K < 4
        reason = None if kept else ("failed" if not passed else "capped")
        selections.append(
            {
                "selection_id": f"sel-{round_}",
                "round": round_,
                "candidate_id": cid,
                "prompt_id": prompt,
                "kept": kept,
                "drop_reason": reason,
                "run_id": f"run-{round_}",
                "created_at": stamp,
            }
        )
    return candidates, selections


QUERIES = {
    "count(*)": "SELECT count(*) FROM candidates",
    "funnel": "SELECT * FROM funnel",
    "group by prompt": (
        "SELECT prompt_id, count(*) AS n, avg(n_tokens) AS tokens FROM candidates "
        "GROUP BY prompt_id ORDER BY n DESC, prompt_id LIMIT 10"
    ),
}


def time_queries(lake: Lake, repeats: int = 3) -> dict[str, float]:
    """Median seconds of each query, each read from the lake's latest snapshot."""
    out = {}
    for name, sql in QUERIES.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            lake.query(sql)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=1_000, help="candidate rows per batch")
    ap.add_argument("--dir", help="lake folder (default: a temporary folder, removed after)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="thresher-lake-bench-")) / "lake"
    rng = np.random.default_rng(0)
    pool = text_pool(20_000, rng)
    lake = Lake(root)
    cand_times: list[float] = []
    total = 0.0
    start_all = time.perf_counter()
    for b in range(args.batches):
        if b % ROUND_BATCHES == 0:
            round_ = b // ROUND_BATCHES
            config = {"name": "bench", "round": round_}
            record_run(
                lake, f"run-{round_}", flow="curate", round_=round_, model="bench-model",
                config=config, status="completed", started_at=datetime.now(UTC),
                finished=True, selection_id=f"sel-{round_}",
            )  # fmt: skip
        candidates, selections = batch_rows(b, args.rows, pool, rng)
        t0 = time.perf_counter()
        assert lake.append("candidates", candidates) == args.rows
        t1 = time.perf_counter()
        assert lake.append("selections", selections) == args.rows
        t2 = time.perf_counter()
        cand_times.append(t1 - t0)
        total += t2 - t0
        if (b + 1) % 500 == 0:
            recent = statistics.median(cand_times[-100:])
            print(
                f"  {b + 1:>6} batches  {(b + 1) * args.rows:>11,} rows  "
                f"append {recent * 1000:6.1f} ms (median of last 100)  "
                f"{time.perf_counter() - start_all:7.0f} s",
                flush=True,
            )
    first = statistics.median(cand_times[:100])
    last = statistics.median(cand_times[-100:])
    rows = lake.count("candidates")
    assert rows == args.batches * args.rows, rows
    files = len(lake.tables.files("candidates")[1])
    print(f"\ncandidates: {rows:,} rows in {files:,} files, {args.batches:,} commits")
    print(f"append (1,000 rows) first 100: {first * 1000:.1f} ms, last 100: {last * 1000:.1f} ms")
    print(f"append growth: {last / first:.3f}  (goal <= 1.5)")
    commits = 2 * args.batches
    print(f"total append time: {total:.0f} s (candidates and selections, {commits:,} commits)")
    before = time_queries(lake)
    t0 = time.perf_counter()
    done = compact(lake)
    compact_s = time.perf_counter() - t0
    after = time_queries(lake)
    files_after = len(lake.tables.files("candidates")[1])
    print(f"thresher compact: {compact_s:.0f} s, candidates {files:,} -> {files_after} files")
    print(f"{'query':<18}{'before compact':>16}{'after compact':>16}")
    for name in QUERIES:
        print(f"{name:<18}{before[name]:>15.2f}s{after[name]:>15.2f}s")
    print(f"funnel after compaction: {after['funnel']:.2f} s  (goal <= 2 s)")
    summary = {
        "rows": rows, "files_before": files, "files_after": files_after,
        "append_growth": last / first, "append_first_ms": first * 1000,
        "append_last_ms": last * 1000, "total_append_s": total, "compact_s": compact_s,
        "before": before, "after": after, "compacted": done,
    }  # fmt: skip
    print(json.dumps(summary, default=str))
    if not args.dir:
        shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
