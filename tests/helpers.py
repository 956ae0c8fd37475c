"""Small helpers shared by unit tests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARITHMETIC = ROOT / "examples" / "arithmetic"

# basic_arithmetic's curriculum levels in the environment tests, easiest first
ARITHMETIC_LEVELS = [
    {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2},
    {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2},
]

# a verifier's verdict rows: these columns, in this order
VERDICT_COLUMNS = ["candidate_id", "verifier", "score", "passed", "reason", "elapsed_ms", "answer"]


def ingest_arithmetic(lake, dataset: str = "arith", split: str = "train", source: str = "train"):
    """Ingest examples/arithmetic/<source>.jsonl (its questions under `question`) into `lake`
    as `dataset`'s `split`, task arithmetic: the ingest report."""
    from thresher.ingest.load import ingest

    return ingest(
        lake,
        ARITHMETIC / f"{source}.jsonl",
        dataset=dataset,
        split=split,
        mapping={"prompt": "question"},
        task="arithmetic",
    )


def write_jsonl(path: Path, rows) -> Path:
    """`rows` as a JSON Lines file at `path` (a row given as a string is written as it is)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run_module(module: str, *args: str, **kw) -> subprocess.CompletedProcess:
    """`python -m module args...` with this interpreter, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, **kw
    )


def thresher(*args: str, **kw) -> subprocess.CompletedProcess:
    """The `thresher` command line run as a process, its output captured as text."""
    return run_module("thresher.flows.cli", *args, **kw)


def curate_cmd(cfg_path, lake_root) -> list[str]:
    """The command line of `thresher curate -c CFG --lake LAKE --no-progress`."""
    return [sys.executable, "-m", "thresher.flows.cli", "curate", "-c", str(cfg_path),
            "--lake", str(lake_root), "--no-progress"]  # fmt: skip


def kill_mid_run(cmd: list[str], written, at_least: int, env=None) -> None:
    """Start `cmd` in a session of its own, SIGKILL the whole session once `written()` has
    reached `at_least` (within 300 s), and reap it."""
    import os
    import signal
    import time

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while written() < at_least and proc.poll() is None:
        assert time.monotonic() < deadline, "curate never wrote a batch"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the engine and Prefect's server die with it
    proc.wait()


def resume_run(cmd: list[str], sampled_now: int, env=None) -> subprocess.CompletedProcess:
    """Run the killed `cmd` again to its end: it must succeed and sample only the
    `sampled_now` candidates that were missing."""
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"({sampled_now} sampled now" in res.stdout
    return res


def train_settings(**settings):
    """TrainSettings for the tiny model: learning rate 3e-3, 64 tokens, no warm-up, no
    validation split, a metric every step, no checkpoint; `settings` override these."""
    from thresher.config import TrainSettings

    tiny = {"learning_rate": 3e-3, "max_len": 64, "warmup_ratio": 0.0, "eval_fraction": 0.0}
    return TrainSettings(**{**tiny, "log_every": 1, "save_every": 1000, **settings})


def train_config(tiny_model, data, max_steps: int, lora_r: int, **settings) -> dict:
    """A `thresher train` config of the tiny model on `data`: `max_steps` of LoRA of rank
    `lora_r` (alpha twice that), six rows a batch, no warm-up or validation split, a metric
    every step; `settings` add to and override these."""
    return {
        "name": "t",
        "base_model": str(tiny_model),
        "data": {"path": str(data)},
        "learning_rate": 3e-3,
        "max_steps": max_steps,
        "batch_size": 6,
        "max_len": 64,
        "lora": {"r": lora_r, "alpha": 2 * lora_r},
        "warmup_ratio": 0.0,
        "eval_fraction": 0.0,
        "log_every": 1,
        **settings,
    }


def tiny_curate(tiny_model, name: str, prompts: dict, **settings) -> dict:
    """Settings of a curate run of the tiny model on the CPU (float32, 256 tokens of context)
    over `prompts`; `settings` add the rest."""
    engine = {"dtype": "float32", "max_model_len": 256}
    return {
        "name": name,
        "model": str(tiny_model),
        "prompts": prompts,
        "engine": engine,
        **settings,
    }


def full_training(**settings) -> dict:
    """A bootstrap's `train` section: full fine-tuning, no validation split, `settings`."""
    return {"method": "full", "eval_fraction": 0.0, **settings}


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
