"""Small helpers shared by unit tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def candidates_of(lake, prompt_ids: list[str]) -> list[str]:
    """The candidate ids of these prompts, in prompt and sample order."""
    rows = lake.query(
        "SELECT candidate_id FROM candidates WHERE prompt_id IN (SELECT unnest(?)) "
        "ORDER BY prompt_id, sample_idx",
        [list(prompt_ids)],
    )
    return rows["candidate_id"].to_list()


def select(lake, prompt_ids: list[str], rule=None, eval_index=None, **settings) -> int:
    """Select these prompts' candidates (selection "r", round 0) with SelectConfig(**settings)."""
    from thresher.config import SelectConfig
    from thresher.plan import RoundPlan
    from thresher.selection.select import select_batch

    ids = candidates_of(lake, prompt_ids)
    plan = RoundPlan(run_id=None, selection_id="r", round=0, rule=rule, verifiers=())
    return select_batch(lake, plan, SelectConfig(**settings), ids, eval_index)


# Two writers on one table: both append the same batches (in opposite orders), then
# batches of their own; each must land exactly once. argv: lake, name (A/B), batches.
TWO_WRITERS = """
import sys
from thresher.stores.lake import Lake
lake = Lake(sys.argv[1])
name, n = sys.argv[2], int(sys.argv[3])
for b in (range(n) if name == "A" else reversed(range(n))):
    rows = [{"candidate_id": f"c{b}-{j}", "prompt_id": f"p{b}", "text": "x"} for j in range(20)]
    lake.append("candidates", rows)
for b in range(n):
    rows = [{"candidate_id": f"{name}{b}-{j}", "prompt_id": name, "text": "y"}
            for j in range(20)]
    assert lake.append("candidates", rows) == 20
"""


def run_two_writers(lake_location: str, batches: int) -> None:
    """Run TWO_WRITERS as two processes at the same time; both must succeed."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_WRITERS, lake_location, name, str(batches)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name in ("A", "B")
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]


def kept_pipeline(lake, name: str, rounds: int, per_round: int) -> None:
    """Pipeline `name`'s kept data without sampling: for each round a completed curate run,
    `per_round` prompts each with one candidate answer, all kept."""
    from datetime import UTC, datetime, timedelta

    from thresher.stores.runs import record_run

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for r in range(rounds):
        sid = f"{name}-sel-{r}"
        ids = [f"{name}-r{r}-{i}" for i in range(per_round)]
        lake.append(
            "prompts",
            [
                {"prompt_id": f"p-{c}", "dataset": name, "split": "train", "task": "math",
                 "prompt": f"{name} question {r}.{i}?", "answer": str(i)}
                for i, c in enumerate(ids)
            ],
        )  # fmt: skip
        lake.append(
            "candidates",
            [
                {"candidate_id": c, "prompt_id": f"p-{c}", "run_id": sid, "round": r,
                 "model": "m", "sample_idx": 0, "text": f"answer {i}", "hinted": False}
                for i, c in enumerate(ids)
            ],
        )  # fmt: skip
        lake.append(
            "selections",
            [
                {"selection_id": sid, "candidate_id": c, "round": r, "prompt_id": f"p-{c}",
                 "kept": True, "run_id": sid}
                for c in ids
            ],
        )  # fmt: skip
        record_run(
            lake,
            sid,
            flow="curate",
            round_=r,
            model="m",
            config={"name": name},
            status="completed",
            started_at=t0 + timedelta(minutes=r),
            summary={"kept": per_round},
            finished=True,
            selection_id=sid,
        )
