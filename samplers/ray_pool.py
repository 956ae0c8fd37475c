"""A pool of long-lived vLLM engines on a Ray cluster, one actor per GPU (`executor: ray`).

Each `sample` call runs on the next idle engine; the caller keeps one batch per engine in
flight (plus one queued), so the engines keep sampling while it handles finished batches.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from typing import Any

from thresher.cluster import cluster_gpus, connect
from thresher.config import RayConfig
from thresher.samplers.tools import engine_step, sample_with_tools
from thresher.samplers.vllm_offline import get_engine, render_prompts, sample

_POOL: dict[str, Any] = {"key": None, "pool": None}
_POOL_LOCK = threading.Lock()


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
        self.llm = get_engine(**engine_kwargs)

    def ready(self) -> bool:
        return True

    def sample(
        self, prompts, messages, k: int, params: dict[str, Any], lora: str | None, tools=None
    ):
        rendered = render_prompts(self.llm, prompts, messages)
        if tools is not None:
            step = engine_step(self.llm, rendered, params, lora)
            return sample_with_tools(
                step, len(rendered), k, tools, max_tokens=params["max_tokens"], stop=params["stop"]
            )
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

    def sample(
        self, prompts, messages, k: int, params: dict[str, Any], lora: str | None, tools=None
    ):
        """k completions per prompt from the first engine that is free (with `tools`, each
        calling the code tool as it goes)."""
        import ray

        i = self._idle.get()
        try:
            call = self.actors[i].sample.remote(prompts, messages, k, params, lora, tools)
            out = ray.get(call)
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
