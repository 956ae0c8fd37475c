"""Training in several processes: the flow's side starts torchrun, each process runs this
module's `main`.

The parent writes the settings and the rows to <out>/launch/ (job.json, rows.jsonl), runs
`python -m torch.distributed.run --standalone --nproc_per_node N -m thresher.trainers.launch
<out>/launch`, forwards its output (also kept in launch/train.log), and hands the metric
rows rank 0 appends to launch/metrics.jsonl to `on_metrics` as they come. Rank 0 writes
launch/result.json at the end; a non-zero exit raises DistributedTrainingError with the
end of the log.
"""

from __future__ import annotations

import codecs
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from thresher.config import TrainSettings
from thresher.processes import stop_process
from thresher.trainers.distributed import close_distributed, init_distributed
from thresher.trainers.sft import TrainResult, train

TAIL_CHARS = 6000


class DistributedTrainingError(RuntimeError):
    """torchrun (or one of its training processes) exited with an error."""


def torchrun_command(job_dir: Path, processes: int) -> list[str]:
    """The torchrun command line that trains the job in `job_dir` with `processes`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        "-m",
        "thresher.trainers.launch",
        str(job_dir),
    ]


def run_training(
    settings: TrainSettings,
    base_model: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    on_metrics: Callable[[list[dict]], None] | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train as `settings.distributed` says: in this process, or in several processes under
    torchrun (the one place that decides where training runs)."""
    d = settings.distributed
    if d.processes > 1:
        return train_distributed(
            settings,
            base_model,
            rows,
            out_dir,
            d.processes,
            d.strategy,
            d.backend,
            on_metrics,
            progress,
        )

    return train(settings, base_model, rows, out_dir, on_metrics=on_metrics, progress=progress)


def train_distributed(
    settings: TrainSettings,
    base_model: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    processes: int,
    strategy: str = "ddp",
    backend: str = "auto",
    on_metrics: Callable[[list[dict]], None] | None = None,
    progress: bool = True,
) -> TrainResult:
    """trainers.sft.train in `processes` processes under torchrun; returns rank 0's
    TrainResult. Resumes from out_dir's newest checkpoint as train does."""
    out = Path(out_dir)
    job_dir = out / "launch"
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.mkdir(parents=True)

    job = {  # the settings alone: a TrainConfig's pipeline fields stay with the flow
        "settings": settings.model_dump(include=set(TrainSettings.model_fields)),
        "base_model": base_model,
        "out": str(out),
        "strategy": strategy,
        "backend": backend,
    }
    (job_dir / "job.json").write_text(json.dumps({**job, "progress": progress}, default=str))
    with open(job_dir / "rows.jsonl", "w") as f:
        f.writelines(json.dumps(r, default=str) + "\n" for r in rows)
    try:
        code, tail = _run(torchrun_command(job_dir, processes), job_dir, processes, on_metrics)
    finally:
        (job_dir / "rows.jsonl").unlink(missing_ok=True)  # a copy of lake data
    if code != 0:
        raise DistributedTrainingError(
            f"distributed training ({processes} processes, {strategy}) exited with code "
            f"{code}; the end of its log ({job_dir / 'train.log'}):\n{tail}"
        )
    return _read_result(job_dir)


def _run(
    cmd: list[str], job_dir: Path, processes: int, on_metrics: Callable | None
) -> tuple[int, str]:
    """Run torchrun to the end, forwarding its output and metrics; (exit code, log tail)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    tail: list[str] = []
    reader = threading.Thread(target=_forward, args=(proc, job_dir / "train.log", tail))
    reader.start()
    offset = 0
    try:
        while proc.poll() is None:
            offset = _drain_metrics(job_dir / "metrics.jsonl", offset, on_metrics)
            time.sleep(0.5)
    finally:
        if proc.poll() is None:  # interrupted: stop the training processes too
            stop_process(proc)
        reader.join()
    _drain_metrics(job_dir / "metrics.jsonl", offset, on_metrics)
    return proc.returncode, "".join(tail)


def _forward(proc: subprocess.Popen, log: Path, tail: list[str]) -> None:
    """Copy the process's output to our stderr and to `log`, keeping its last characters."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(log, "wb") as f:
        for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):
            f.write(chunk)
            f.flush()
            text = decode.decode(chunk)
            sys.stderr.write(text)
            sys.stderr.flush()
            kept = ("".join(tail) + text)[-TAIL_CHARS:]
            tail[:] = [kept]


def _drain_metrics(path: Path, offset: int, on_metrics: Callable | None) -> int:
    """Hand the complete metric lines after `offset` to on_metrics; the new offset."""
    if not path.exists():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    if rows and on_metrics:
        on_metrics(rows)
    return offset + end


def _read_result(job_dir: Path) -> TrainResult:
    path = job_dir / "result.json"
    if not path.exists():
        raise DistributedTrainingError(f"distributed training exited without writing {path}")
    data = json.loads(path.read_text())
    for key in ("model_dir", "adapter_dir"):
        data[key] = Path(data[key]) if data[key] else None
    return TrainResult(**data)


def _metrics_writer(path: Path) -> Callable[[list[dict]], None]:
    def write(rows: list[dict]) -> None:
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    return write


def run_job(job_dir: Path) -> None:
    """One training process's work: join the group, train, rank 0 writes the result."""
    job = json.loads((job_dir / "job.json").read_text())
    with open(job_dir / "rows.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    dist = init_distributed(job["strategy"], job["backend"])
    try:
        result = train(
            TrainSettings(**job["settings"]),
            job["base_model"],
            rows,
            job["out"],
            on_metrics=_metrics_writer(job_dir / "metrics.jsonl") if dist.main else None,
            progress=job["progress"] and dist.main,
            dist=dist,
        )
        if dist.main:
            tmp = job_dir / ".result.json.tmp"
            tmp.write_text(json.dumps(asdict(result), default=str))
            os.replace(tmp, job_dir / "result.json")
    finally:
        close_distributed()


def main(argv: list[str] | None = None) -> None:
    """torchrun's entry point: `-m thresher.trainers.launch JOB_DIR`."""
    from torch.distributed.elastic.multiprocessing.errors import record

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or "RANK" not in os.environ:
        raise SystemExit("usage (under torchrun): torchrun ... -m thresher.trainers.launch JOB_DIR")
    record(run_job)(Path(args[0]))


if __name__ == "__main__":
    main()
