"""Agreement on real candidates: thresher's `reasoning_gym` verifier against reasoning-gym's
own scorer called directly, and thresher's `math` verifier against both.

Reads every candidate of a lake whose prompt came from `ingest --from reasoning-gym` (a
documented SmolLM2 run's lake: `make reasoning-gym`), judges it three ways and prints
`reasoning_gym agreement with reasoning-gym's scorer: X` (all candidates, and those with
<answer> tags, where both read the same answer), `reasoning_gym false passes: N` (passes
that the direct call fails), `math agreement with reasoning-gym's scorer: X` and the
counts of each kind of disagreement. The disagreements go to --out (JSONL) to read by hand.

The direct call is what reasoning-gym's own evaluation does: `extract_answer` (the last
<answer> tags), then the task's `score_answer(answer, entry)` on the stored entry, a pass
at score 1.0.

    .venv/bin/python bench/envs_agreement.py --lake lake-rg [--out disagreements.jsonl]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def direct_scores(rows: list[dict]) -> list[float | None]:
    """reasoning-gym's own score of each candidate (None where its scorer raised)."""
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    datasets: dict[str, object] = {}
    out: list[float | None] = []
    for row in rows:
        meta = json.loads(row["meta"])
        key = json.dumps([meta["generator"], meta.get("config") or {}], sort_keys=True)
        if key not in datasets:
            datasets[key] = reasoning_gym.create_dataset(
                meta["generator"], size=1, seed=0, **(meta.get("config") or {})
            )
        try:
            answer = extract_answer(row["text"] or "")
            out.append(float(datasets[key].score_answer(answer, meta["entry"])))
        except Exception:  # a scorer that raises: the direct call has no verdict
            out.append(None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", default="lake-rg")
    parser.add_argument("--out", default="envs-disagreements.jsonl")
    args = parser.parse_args()

    from thresher.stores.lake import Lake
    from thresher.verifiers import get_verifier

    lake = Lake(args.lake, create=False)
    batch = lake.query(
        """SELECT c.candidate_id, c.text, p.prompt_id, p.task, p.prompt, p.answer, p.meta
           FROM candidates c JOIN prompts p USING (prompt_id)
           WHERE json_extract_string(p.meta, '$.env') = 'reasoning-gym'
           ORDER BY c.candidate_id"""
    )
    if batch.is_empty():
        raise SystemExit(f"no candidates of reasoning-gym prompts in {args.lake}")
    rows = batch.to_dicts()
    direct = direct_scores(rows)
    direct_pass = [s is not None and s >= 1.0 for s in direct]
    ours = get_verifier("reasoning_gym").run(batch)
    math = get_verifier("math").run(batch)
    ours_pass, math_pass = ours["passed"].to_list(), math["passed"].to_list()
    tagged = ["</answer>" in (r["text"] or "") and "<answer>" in (r["text"] or "") for r in rows]
    n = len(rows)

    def share(pairs: list[tuple[bool, bool]]) -> str:
        same = sum(a == b for a, b in pairs)
        return f"{same / len(pairs):.4f} ({same}/{len(pairs)})" if pairs else "n/a"

    both = list(zip(ours_pass, direct_pass, strict=True))
    print(f"{n} candidates of {batch['prompt_id'].n_unique()} prompts, {sum(tagged)} with tags")
    print(f"direct scorer passes: {sum(direct_pass)}; raised: {direct.count(None)}")
    print(f"reasoning_gym agreement with reasoning-gym's scorer: {share(both)}")
    print(
        "reasoning_gym agreement where the answer has <answer> tags: "
        + share([p for p, t in zip(both, tagged, strict=True) if t])
    )
    false_pass = sum(o and not d for o, d in both)
    false_fail = sum(d and not o for o, d in both)
    print(f"reasoning_gym false passes: {false_pass}; false fails: {false_fail}")
    print(
        "math agreement with reasoning-gym's scorer: "
        + share(list(zip(math_pass, direct_pass, strict=True)))
    )
    print(
        "math agreement with thresher's reasoning_gym: "
        + share(list(zip(math_pass, ours_pass, strict=True)))
    )
    kinds: Counter = Counter()
    with Path(args.out).open("w") as f:
        for i, row in enumerate(rows):
            verdicts = (ours_pass[i], direct_pass[i], math_pass[i])
            if len(set(verdicts)) == 1:
                continue
            kind = ", ".join(
                f"{name} {'passes' if v else 'fails'}"
                for name, v in zip(("reasoning_gym", "direct", "math"), verdicts, strict=True)
            )
            kinds[(row["task"], kind)] += 1
            f.write(
                json.dumps(
                    {
                        "task": row["task"],
                        "reference": row["answer"],
                        "text": row["text"],
                        "direct_score": direct[i],
                        "reasoning_gym": ours.row(i, named=True)["reason"],
                        "math": math.row(i, named=True)["reason"],
                        "kind": kind,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
    print(f"disagreements ({sum(kinds.values())}, written to {args.out}):")
    for (task, kind), count in kinds.most_common():
        print(f"  {count:>5}  {task}: {kind}")


if __name__ == "__main__":
    main()
