"""The Ray executor against the local one: the same curate round, one engine each.

Starts a one-node Ray cluster on 127.0.0.1 (its own temp dir), then runs the same curate
round (tiny word-problem model, greedy, fresh lake each time) with `executor: local`
(the engine in this process) and `executor: ray` (one engine actor, verification as Ray
tasks). Engines start once, outside the timings; repeats alternate the two sides and
medians are compared. Prints each side's candidates/s and
`ray executor efficiency: X` (local time / Ray time: 1.0 means the Ray path costs
nothing; the cluster's throughput is then about engines x X x the local rate).

    .venv/bin/python bench/cluster.py [--prompts 2000] [--batch-size 250] [--repeats 3]
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared import WORD_MODEL, fresh_lake, options, word_model, word_problems


def start_ray(cpus: int) -> tuple[subprocess.Popen, str]:
    """A one-node Ray cluster on 127.0.0.1: (head process, address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local cluster: no tokens (head and clients)
    ray = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
        + ["--port", str(port), "--temp-dir", temp, "--num-cpus", str(cpus)]
        + ["--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    for _ in range(120):
        if subprocess.run([ray, "status", "--address", address], capture_output=True).returncode:
            time.sleep(1)
            continue
        return proc, address
    raise SystemExit("ray did not start")


def main() -> None:
    parser = options(
        __doc__, prompts=2000, batch_size=250, max_tokens=32, repeats=3, model=WORD_MODEL
    )
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from thresher.config import CurateConfig
    from thresher.flows.curate import curate_flow
    from thresher.flows.runtime import flow_settings, quiet_task_logs, stop_engine
    from thresher.samplers.engines import local_engine
    from thresher.verifiers.math_answer import MathAnswer

    word_model(args.model)
    tmp, source = word_problems("thresher-bench-cluster-", args.prompts, seed=2)
    head, address = start_ray(cpus=(os.cpu_count() or 2) + 1)  # the engine's, and 1 to verify
    base = dict(
        name="bench-cluster",
        model=args.model,
        batch_size=args.batch_size,
        prompts={"dataset": "bench"},
        sampling={"k": 1, "temperature": 0.0, "max_tokens": args.max_tokens},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": [MathAnswer.name]},
        select={"cap": 4, "decontaminate": {"enabled": False}},
    )
    local = CurateConfig(**base)
    cores = os.cpu_count() or 2
    ray_cfg = {"address": address, "engines": 1, "cpus_per_engine": cores}  # all cores, as local
    on_ray = CurateConfig(**base, executor="ray", ray=ray_cfg)
    quiet_task_logs()

    def run(cfg: CurateConfig) -> float:
        lake = fresh_lake(tmp, source)
        start = time.perf_counter()
        with flow_settings():
            summary = curate_flow(cfg.model_dump(), str(lake.root), False)
        assert summary.candidates == args.prompts, summary
        return time.perf_counter() - start

    try:
        local_engine(local)
        run(local)  # warm-up: engine, caches; then the Ray side's engine actor
        run(on_ray)
        local_t, ray_t = [], []
        for _ in range(args.repeats):
            local_t.append(run(local))
            ray_t.append(run(on_ray))
    finally:
        stop_engine()
        import ray

        ray.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
    lt, rt = statistics.median(local_t), statistics.median(ray_t)
    print(f"prompts {args.prompts} (k 1, greedy), batches of {args.batch_size}, one engine each")
    for side, t, runs in (("local", lt, local_t), ("ray", rt, ray_t)):
        rate, each = args.prompts / t, [round(r, 2) for r in runs]
        print(f"{side} executor: {t:.2f} s median, {rate:.0f} candidates/s {each}")
    print(f"ray executor efficiency: {lt / rt:.3f}")


if __name__ == "__main__":
    main()
