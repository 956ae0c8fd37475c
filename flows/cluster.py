"""`executor: ray`: the sampling and verification stages on a Ray cluster.

Prefect stays the orchestrator: the curate flow's tasks are the same, and inside them
sampling goes to a pool of long-lived vLLM engines (one Ray actor per GPU) and
verification is split into chunks run as Ray tasks on the cluster's CPUs. The flow
process writes every result to the lake by batch, as with the local executor, so ids,
idempotence and resume do not depend on where the work ran.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from typing import Any

from thresher.flows.config import RayConfig

_POOL: dict[str, Any] = {"key": None, "pool": None}
_POOL_LOCK = threading.Lock()
_REMOTE: dict[str, Any] = {}


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` once (None: $RAY_ADDRESS, else the cluster last
    started on this machine, else a new local instance: Ray's own rules)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "executor: ray needs Ray on this machine: pip install 'thresher[ray]'"
        ) from None
    if ray.is_initialized():
        return
    print(f"connecting to Ray at {address or 'auto'} ...", file=sys.stderr, flush=True)
    ray.init(address=address, namespace="thresher", logging_level="WARNING")


def cluster_gpus(address: str | None) -> float:
    """GPUs the cluster has in all."""
    import ray

    connect(address)
    return float(ray.cluster_resources().get("GPU", 0))


def engine_count(ray_cfg: RayConfig) -> int:
    """How many engines the pool runs: as configured, else one per GPU (1 without GPUs)."""
    if ray_cfg.engines:
        return ray_cfg.engines
    gpus = cluster_gpus(ray_cfg.address)
    per = ray_cfg.gpus_per_engine or 1
    return max(1, int(gpus // per))


class _EngineActor:
    """One vLLM engine, alive as long as the pool."""

    def __init__(self, engine_kwargs: dict[str, Any]):
        from thresher.samplers.vllm_offline import get_engine

        self.llm = get_engine(**engine_kwargs)

    def ready(self) -> bool:
        return True

    def sample(self, prompts, messages, k: int, params: dict[str, Any], lora: str | None):
        from thresher.samplers.vllm_offline import render_prompts, sample

        rendered = render_prompts(self.llm, prompts, messages)
        return sample(self.llm, rendered, k=k, lora=lora, **params)


class EnginePool:
    """Long-lived engine actors; each `sample` call runs on the next idle one."""

    def __init__(self, ray_cfg: RayConfig, engine_kwargs: dict[str, Any]):
        import ray

        connect(ray_cfg.address)
        n = engine_count(ray_cfg)
        gpus = ray_cfg.gpus_per_engine if cluster_gpus(ray_cfg.address) else 0
        actor = ray.remote(_EngineActor).options(
            num_gpus=gpus, num_cpus=ray_cfg.cpus_per_engine, max_restarts=1
        )
        print(f"starting {n} vLLM engine(s) on the Ray cluster ...", file=sys.stderr, flush=True)
        self.actors = [actor.remote(engine_kwargs) for _ in range(n)]
        try:
            ray.get([a.ready.remote() for a in self.actors])  # all up, or the engine's error
        except BaseException:
            self.shutdown()
            raise
        self.batches = [0] * n
        self._idle: queue.Queue[int] = queue.Queue()
        for i in range(n):
            self._idle.put(i)

    @property
    def size(self) -> int:
        return len(self.actors)

    def sample(self, prompts, messages, k: int, params: dict[str, Any], lora: str | None):
        """k completions per prompt from the first engine that is free."""
        import ray

        i = self._idle.get()
        try:
            out = ray.get(self.actors[i].sample.remote(prompts, messages, k, params, lora))
            self.batches[i] += 1
            return out
        finally:
            self._idle.put(i)

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


def engine_pool(ray_cfg: RayConfig, engine_kwargs: dict[str, Any]) -> EnginePool:
    """The process's engine pool for these settings (started on first use, reused after)."""
    key = json.dumps([ray_cfg.model_dump(), engine_kwargs], sort_keys=True, default=str)
    with _POOL_LOCK:
        if _POOL["key"] != key:
            shutdown_pool()
            _POOL.update(key=key, pool=EnginePool(ray_cfg, engine_kwargs))
        return _POOL["pool"]


def current_pool() -> EnginePool | None:
    """The running pool, if any."""
    return _POOL["pool"]


def shutdown_pool() -> None:
    """Stop the pool's engines, if a pool runs."""
    pool = _POOL["pool"]
    _POOL.update(key=None, pool=None)
    if pool is not None:
        pool.shutdown()


def _verify_chunk(name: str, options: dict[str, Any] | None, rows):
    from thresher.verifiers import get_verifier

    return get_verifier(name, options).run(rows)


def verify_on_cluster(ray_cfg: RayConfig, name: str, options: dict[str, Any] | None, rows):
    """Verdicts of verifier `name` for `rows`, computed in chunks on the cluster's CPUs."""
    import polars as pl
    import ray

    connect(ray_cfg.address)
    if "verify" not in _REMOTE:  # exported to the cluster once per process
        _REMOTE["verify"] = ray.remote(num_cpus=1)(_verify_chunk)
    task = _REMOTE["verify"]
    step = ray_cfg.verify_chunk
    refs = [task.remote(name, options, rows.slice(i, step)) for i in range(0, rows.height, step)]
    return pl.concat(ray.get(refs), how="diagonal_relaxed")


def is_cluster_failure(error: BaseException) -> bool:
    """A lost actor or node: worth retrying the batch (Ray restarts the engine)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError

    return isinstance(error, ActorDiedError | ActorUnavailableError | NodeDiedError)
