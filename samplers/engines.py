"""Where sampling runs, chosen once from the config: an OpenAI-compatible server, a pool of
engines on a Ray cluster, or this process's vLLM engine. Callers see one `Sampler`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thresher.config import CurateConfig
from thresher.samplers.vllm_offline import Completion

Backend = Callable[[Sequence[str | None], Sequence[str | None], int], list[list[Completion]]]


@dataclass
class Sampler:
    """Turns prompts (text, or chat messages as JSON) into n completions each."""

    backend: Backend
    chat: bool  # plain prompts go through the chat template as one user message

    def sample(
        self, prompts: Sequence[str | None], messages: Sequence[str | None], n: int
    ) -> list[list[Completion]]:
        """n completions for each prompt (messages win over the prompt text when set)."""
        if self.chat:
            messages = [
                m if m else json.dumps([{"role": "user", "content": p}])
                for p, m in zip(prompts, messages, strict=True)
            ]
        return self.backend(prompts, messages, n)


def sampler_for(cfg: CurateConfig, before_engine: Callable[[], None] | None = None) -> Sampler:
    """The config's sampler; a local engine starts on first use (after `before_engine`,
    e.g. taking the device slot) and stays up for the process until `shutdown`."""
    s = cfg.sampling
    params = dict(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_tokens=s.max_tokens,
        stop=s.stop,
    )
    if cfg.server:
        return Sampler(_server_backend(cfg, params), s.chat)
    if cfg.executor == "ray":
        from thresher.samplers.ray_pool import engine_pool

        # the engines run in other processes and on other nodes: absolute paths
        kwargs = engine_kwargs(cfg) | {"model": _absolute(cfg.model)}
        pool, lora = engine_pool(cfg.ray, kwargs), cfg.lora and _absolute(cfg.lora)
        return Sampler(
            lambda prompts, messages, n: pool.sample(prompts, messages, n, params, lora), s.chat
        )
    from thresher.samplers.vllm_offline import render_prompts, sample

    llm = local_engine(cfg, before_engine)
    return Sampler(
        lambda prompts, messages, n: sample(
            llm, render_prompts(llm, prompts, messages), k=n, lora=cfg.lora, **params
        ),
        s.chat,
    )


def _server_backend(cfg: CurateConfig, params: dict[str, Any]) -> Backend:
    from thresher.samplers.openai_server import sample_server

    srv = cfg.server
    key = os.environ.get(srv.api_key_env) if srv.api_key_env else None
    return lambda prompts, messages, n: sample_server(
        srv.base_url,
        cfg.model,
        prompts,
        messages,
        k=n,
        concurrency=srv.concurrency,
        retries=srv.retries,
        timeout=srv.timeout_s,
        api_key=key,
        vllm_extensions=srv.vllm_extensions,
        **params,
    )


def batches_in_flight(cfg: CurateConfig) -> int:
    """How many batches to keep sampling at once: one per engine plus one queued on a Ray
    cluster, so its engines never wait; one elsewhere."""
    if cfg.executor != "ray" or cfg.server:
        return 1
    from thresher.samplers.ray_pool import engine_count

    return engine_count(cfg.ray) + 1


def run_stats(cfg: CurateConfig) -> dict[str, Any]:
    """Where the run sampled, for its summary: on Ray, how many batches each engine served."""
    if cfg.executor != "ray" or cfg.server:
        return {}
    from thresher.samplers.ray_pool import current_pool

    pool = current_pool()
    return {"executor": "ray", "engines": pool.size if pool else 0} | (
        {"batches_per_engine": list(pool.batches)} if pool else {}
    )


def _absolute(path: str) -> str:
    return str(Path(path).absolute()) if Path(path).exists() else path


def engine_kwargs(cfg: CurateConfig) -> dict[str, Any]:
    """The arguments of `get_engine` for this config."""
    from thresher.samplers.vllm_offline import lora_rank

    e = cfg.engine
    return dict(
        model=cfg.model,
        seed=cfg.sampling.seed,
        dtype=e.dtype,
        max_model_len=e.max_model_len,
        gpu_memory_utilization=e.gpu_memory_utilization,
        enforce_eager=e.enforce_eager,
        max_lora_rank=lora_rank(cfg.lora) if cfg.lora else None,
        extra=e.extra,
    )


def local_engine(cfg: CurateConfig, before_engine: Callable[[], None] | None = None):
    """This process's vLLM engine for the config (started on first use, after
    `before_engine`)."""
    from thresher.samplers.vllm_offline import get_engine

    if before_engine is not None:
        before_engine()
    return get_engine(**engine_kwargs(cfg))


def shutdown() -> None:
    """Stop this process's engine and, if one runs, its Ray engine pool."""
    from thresher.samplers.vllm_offline import shutdown_engine

    shutdown_engine()
    if "thresher.samplers.ray_pool" in sys.modules:  # only when a pool may run
        from thresher.samplers.ray_pool import shutdown_pool

        shutdown_pool()
