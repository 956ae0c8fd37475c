"""Wrong reference answers at the demo's scale: the demo's rounds twice on a training set
with `--share` of its references replaced by plausible wrong answers, with the suspect
reference check (`select.suspects`, its defaults) and without it.

The wrong answers, a third of each kind: off by one, a common slip (another operation on
the problem's two numbers: a sum for a product or a difference, a difference for a sum)
and another prompt's answer. Each run has a lake of its own. Prints per round: the flags'
precision and recall (prompts flagged by then against the injected ones), the examples
kept of injected prompts with the check and without it, and held-out pass@1 of each run;
then the last models' paired difference with its 95 % interval (`check - no check`).

    .venv/bin/python bench/reference_noise.py [--share 0.05] [--rounds 3] [--dir DIR]
        [--teacher-steps 2000 --budget 1000 [--below 0.5]]

With `--teacher-steps N`, both runs also have a teacher (`teachers:`, `--budget`
candidates a round, 8 a prompt) for the prompts the student left unsolved (with `--below
P`, those it solved less often than P): a tiny model
of the same task trained N steps on 3,000 more worked problems. Its samples are the
evidence a weak student cannot give.

Stopped, it goes on where it was when run again with the `--dir` it printed.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

from shared import ROOT, WORD_MODEL, demo_lake, demo_runs, options, print_paired

PASS1 = """SELECT e.round, e.value FROM evals e JOIN runs r USING (run_id)
           WHERE r.flow = 'evaluate' AND json_extract_string(r.config, '$.name') = ?
             AND e.task = 'all' AND e.metric = 'pass@1' AND e.split = 'eval' ORDER BY e.round"""
KEPT = """SELECT round, count(*) AS n FROM current_selections
          WHERE kept AND prompt_id IN (SELECT unnest(?)) GROUP BY round"""
FLAGGED = """SELECT prompt_id, min(round) AS round FROM evidence
             WHERE kind = 'suspect_reference' GROUP BY prompt_id"""


def slip(prompt: str, answer: int) -> int | None:
    """A common slip on a two-number word problem: the other operation's result."""
    a, b = (int(x) for x in re.findall(r"\d+", prompt)[:2])
    if answer == a * b and a * b != a + b:
        return a + b
    if answer == a - b:
        return a + b
    if answer == a + b:
        return abs(a - b)
    return None


def noisy(rows: list[dict], share: float, seed: int) -> tuple[list[dict], dict[str, str]]:
    """The rows with `share` of their references wrong; returns them and prompt -> the
    wrong answer given."""
    rng = random.Random(seed)
    chosen = rng.sample(range(len(rows)), round(share * len(rows)))
    out, wrong = [dict(r) for r in rows], {}
    for n, i in enumerate(chosen):
        right = int(rows[i]["answer"])
        kind = n % 3
        bad = None
        if kind == 1:
            bad = slip(rows[i]["prompt"], right)
        elif kind == 2:
            others = [int(r["answer"]) for r in rows if int(r["answer"]) != right]
            bad = rng.choice(others)
        if bad is None or bad == right or bad < 0:
            bad = right + 1 if right == 0 or rng.random() < 0.5 else right - 1
        out[i]["answer"] = str(bad)
        wrong[rows[i]["prompt"]] = str(bad)
    return out, wrong


def teacher(folder: Path, steps: int) -> str:
    """A stronger tiny model of the demo's task (trained on 3,000 more worked problems, none
    of them in the bundled splits), built once under `folder`."""
    out = folder / "teacher"
    if not (out / "config.json").exists():
        from thresher.trainers.tiny import make_word_problem_model

        make_word_problem_model(folder / "teacher.tmp", train_steps=steps, more=3000)
        (folder / "teacher.tmp").rename(out)
    return str(out)


def main() -> None:
    parser = options(__doc__, share=0.05, rounds=3, seed=1, model=WORD_MODEL, dir="",
                     teacher_steps=0, budget=1000, below=0.0)  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from thresher.config import BootstrapConfig
    from thresher.flows.bootstrap import run_bootstrap

    base, tmp = demo_runs(args.model, args.rounds, args.dir, "bench-noise-")
    words = ROOT / "examples" / "word-problems"
    rows = [json.loads(line) for line in open(words / "train.jsonl")]
    bad_rows, wrong = noisy(rows, args.share, args.seed)
    train = tmp / "train-noisy.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in bad_rows))
    print(f"{len(wrong)} of {len(rows)} references made wrong (seed {args.seed})")
    if args.teacher_steps:
        aim = {"aim": "below", "below": args.below} if args.below else {}
        base["teachers"] = [{"name": "strong", "model": teacher(tmp, args.teacher_steps),
                             "k": 8, "budget": args.budget, **aim}]  # fmt: skip
    lakes = {}
    for name in ("check", "no-check"):
        raw = base | {"name": name}
        if name == "no-check":
            raw["select"] = {**base["select"], "suspects": {"enabled": False}}
        lake = demo_lake(tmp / name / "lake", train)
        run_bootstrap(BootstrapConfig.model_validate(raw), lake.root, progress=False)
        lakes[name] = lake
    ids = dict(lakes["check"].query("SELECT prompt, prompt_id FROM prompts").rows())
    injected = [ids[p] for p in wrong]
    flagged = dict(lakes["check"].query(FLAGGED).rows())
    kept = {n: dict(lk.query(KEPT, [injected]).rows()) for n, lk in lakes.items()}
    pass1 = {n: dict(lk.query(PASS1, [n]).rows()) for n, lk in lakes.items()}
    print("\nround | flags | precision | recall | kept wrong-reference examples: check | "
          "no check | pass@1 check | no check")  # fmt: skip
    for r in range(args.rounds):
        by_then = {p for p, first in flagged.items() if first <= r}
        right = len(by_then & set(injected))
        precision = right / len(by_then) if by_then else float("nan")
        print(f"{r} | {len(by_then)} | {precision:.3f} | {right / len(injected):.3f} | "
              f"{kept['check'].get(r, 0)} | {kept['no-check'].get(r, 0)} | "
              f"{pass1['check'].get(r, float('nan')):.3f} | "
              f"{pass1['no-check'].get(r, float('nan')):.3f}")  # fmt: skip
    total = {n: sum(k.values()) for n, k in kept.items()}
    fall = 1 - total["check"] / total["no-check"] if total["no-check"] else float("nan")
    print(f"kept wrong-reference examples, all rounds: check {total['check']}, no check "
          f"{total['no-check']} ({fall:.1%} fewer)")  # fmt: skip
    print_paired(lakes, "check - no check")


if __name__ == "__main__":
    main()
