"""A teacher where the student is stuck, at the demo's scale: the demo's rounds from the same
tiny student twice, without a teacher and with one.

The plain run is configs/bootstrap-demo.yaml (every round run); its best model, trained on
those rounds, is then the teacher of the same student in a second run of the same rounds
(as a run's best model would teach a fresh student): `teachers:` for the prompts the
student left unsolved (`--budget` candidates a round) and `hints:` from the teacher's
verified solutions. Each run has a lake of its own. Prints per round held-out pass@1 of
each run, the share of the round's prompts the student's own samples never solved in
each, the share nobody solved in the taught run, and the teacher's share of the kept
examples and their tokens; then the last models' paired difference with its 95 %
interval (`taught - plain`).

    .venv/bin/python bench/teachers.py [--rounds 3] [--budget 512] [--dir DIR]

Stopped, it goes on where it was when run again with the `--dir` it printed.
"""

from __future__ import annotations

import os

from shared import ROOT, WORD_MODEL, demo_lake, demo_runs, options, print_paired

PASS1 = """SELECT e.round, e.value FROM evals e JOIN runs r USING (run_id)
           WHERE r.flow = 'evaluate' AND json_extract_string(r.config, '$.name') = ?
             AND e.task = 'all' AND e.metric = 'pass@1' AND e.split = 'eval' ORDER BY e.round"""
ALL_FAIL = """SELECT round, round(avg((kind = 'all_fail')::INT), 3) AS share
              FROM prompt_difficulty GROUP BY round ORDER BY round"""


def main() -> None:
    parser = options(__doc__, rounds=3, budget=512, model=WORD_MODEL, dir="")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from thresher.config import BootstrapConfig
    from thresher.evaluators.report import classes_by_round, sources_by_round
    from thresher.flows.bootstrap import run_bootstrap
    from thresher.stores.models import read_best_pointer

    base, tmp = demo_runs(args.model, args.rounds, args.dir, "bench-teachers-")
    results = {}
    for name in ("plain", "taught"):
        raw = base | {"name": name}
        if name == "taught":
            best = read_best_pointer(results["plain"], "plain")
            print(f"teacher: the plain run's best model, model {best['round']}")
            raw |= {
                "teachers": [{"name": "tiny", "model": best["model"], "k": 8,
                              "budget": args.budget}],
                "hints": {"share": 0.5, "k": 4},
                "select": {**base["select"], "teacher_cap": 2, "max_teacher_share": 0.5},
            }  # fmt: skip
        lake = demo_lake(tmp / name / "lake", ROOT / "examples" / "word-problems" / "train.jsonl")
        run_bootstrap(BootstrapConfig.model_validate(raw), lake.root, progress=False)
        results[name] = lake
    print("\nround | pass@1 plain | pass@1 taught | student all-fail plain | taught | "
          "out of reach (taught) | teacher share of kept | of kept tokens")  # fmt: skip
    plain_p = dict(results["plain"].query(PASS1, ["plain"]).rows())
    taught_p = dict(results["taught"].query(PASS1, ["taught"]).rows())
    plain_f = dict(results["plain"].query(ALL_FAIL).rows())
    taught_f = dict(results["taught"].query(ALL_FAIL).rows())
    reach = {
        r["round"]: r["out_of_reach_share"] for r in classes_by_round(results["taught"]).to_dicts()
    }  # noqa: E501
    sources = sources_by_round(results["taught"], "taught").to_dicts()
    for r in sorted(plain_p):
        kept = [s for s in sources if s["round"] == r]
        share = _share(kept, "kept")
        tokens = _share(kept, "kept_tokens")
        print(f"{r} | {plain_p[r]:.3f} | {taught_p.get(r, float('nan')):.3f} | "
              f"{plain_f.get(r, '-')} | {taught_f.get(r, '-')} | {reach.get(r, '-')} | "
              f"{share} | {tokens}")  # fmt: skip
    print_paired({"taught": results["taught"], "plain": results["plain"]}, "taught - plain")


def _share(rows: list[dict], column: str) -> str:
    total = sum(r[column] for r in rows)
    mine = sum(r[column] for r in rows if r["source"].startswith("teacher:"))
    return f"{mine / total:.3f}" if total else "-"


if __name__ == "__main__":
    main()
