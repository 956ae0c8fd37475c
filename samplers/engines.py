"""Where sampling runs, chosen once (`CurateConfig.placement`): this process's vLLM engine,
an OpenAI-compatible server, or a pool of engines on a Ray cluster. Each is a `Sampler`
with the same small interface (`sample`, `in_flight`, `stats`, `close`); `sampler_for` and
`sampler_at` are the one place that picks which."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thresher.config import CurateConfig, EvalConfig, RayConfig, SamplingConfig, ServerConfig
from thresher.samplers.openai_server import sample_server, server_step
from thresher.samplers.ray_pool import current_pool, engine_count, engine_pool, shutdown_pool
from thresher.samplers.tools import engine_step, sample_with_tools
from thresher.samplers.vllm_offline import (
    Completion,
    get_engine,
    lora_rank,
    render_prompts,
    running_engine,
    sample,
    shutdown_engine,
)

if TYPE_CHECKING:
    from vllm import LLM


class Sampler:
    """Turns prompts (text, or chat messages as JSON) into n completions each."""

    in_flight = 1  # batches worth sampling at once (more where engines run elsewhere)

    def __init__(self, sampling: SamplingConfig):
        self.chat = sampling.chat  # plain prompts go through the chat template as a user turn
        self.params = dict(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_tokens,
            stop=sampling.stop,
        )
        self.tools = sampling.tools

    def sample(
        self, prompts: Sequence[str | None], messages: Sequence[str | None], n: int
    ) -> list[list[Completion]]:
        """n completions for each prompt (messages win over the prompt text when set); with
        `sampling.tools`, each calling the code tool as it goes."""
        messages = self.as_messages(prompts, messages)
        if self.tools is not None:
            return self.generate_with_tools(prompts, messages, n)
        return self.generate(prompts, messages, n)

    def generate_with_tools(
        self, prompts: Sequence[str | None], messages: Sequence[str | None], n: int
    ) -> list[list[Completion]]:
        """The backend's n completions per prompt, the tool's output appended as they go."""
        raise NotImplementedError(f"{type(self).__name__} cannot sample with a tool")

    def as_messages(
        self, prompts: Sequence[str | None], messages: Sequence[str | None]
    ) -> Sequence[str | None]:
        """The messages each prompt is sent as (a plain prompt as one user turn with `chat`)."""
        if not self.chat:
            return messages
        return [
            m if m else json.dumps([{"role": "user", "content": p}])
            for p, m in zip(prompts, messages, strict=True)
        ]

    def generate(
        self, prompts: Sequence[str | None], messages: Sequence[str | None], n: int
    ) -> list[list[Completion]]:
        """The backend's n completions per prompt."""
        raise NotImplementedError

    def too_long(
        self, prompts: Sequence[str | None], messages: Sequence[str | None]
    ) -> list[tuple[int, int] | None]:
        """For each prompt that leaves no room for max_tokens of reply, (its tokens, the
        model's limit); None where it fits, or where the backend cannot tell before asking."""
        return [None] * len(prompts)

    def is_up(self) -> bool:
        """Whether what this sampler runs on is up already (a server always is)."""
        return True

    def stats(self) -> dict[str, Any]:
        """Where the run sampled, for its summary."""
        return {}

    def close(self) -> None:
        """Stop what this sampler started (an engine, a pool)."""


class LocalEngine(Sampler):
    """This process's vLLM engine, started on first use (after `before_engine`, e.g. taking
    the device slot) and kept up until `close`."""

    def __init__(
        self,
        sampling: SamplingConfig,
        engine: dict[str, Any],
        lora: str | None = None,
        before_engine: Callable[[], None] | None = None,
        share: bool = False,
    ):
        super().__init__(sampling)
        self.engine_kwargs, self.lora, self.before_engine = engine, lora, before_engine
        self.share = share  # use a running engine of the same model whatever its settings

    def engine(self):
        """The vLLM engine (started on first use, replacing one of another model)."""
        running = running_engine()
        if running and self.share and self.is_up():
            return running[1]
        if running and not same_model(running[0], self.engine_kwargs["model"]):
            print(
                f"stopping the vLLM engine of {running[0]} to start one for "
                f"{self.engine_kwargs['model']}",
                file=sys.stderr,
                flush=True,
            )
        if self.before_engine is not None:
            self.before_engine()
        return get_engine(**self.engine_kwargs)

    def rendered(self, prompts, messages) -> list[str]:
        """The prompt strings the engine is given (chat messages through its template)."""
        return render_prompts(
            self.engine(), list(prompts), list(self.as_messages(prompts, messages))
        )

    def generate(self, prompts, messages, n):
        llm = self.engine()
        rendered = render_prompts(llm, list(prompts), list(messages))
        return sample(llm, rendered, k=n, lora=self.lora, **self.params)

    def generate_with_tools(self, prompts, messages, n):
        llm = self.engine()
        rendered = render_prompts(llm, list(prompts), list(messages))
        p = self.params
        return sample_with_tools(
            engine_step(llm, rendered, p, self.lora),
            len(rendered),
            n,
            self.tools,
            max_tokens=p["max_tokens"],
            stop=p["stop"],
        )

    def too_long(self, prompts, messages):
        llm = self.engine()
        tokenizer = llm.get_tokenizer()
        limit = llm.llm_engine.model_config.max_model_len
        room = self.params["max_tokens"]
        counts = [len(tokenizer.encode(text)) for text in self.rendered(prompts, messages)]
        return [(n, limit) if n + room > limit else None for n in counts]

    def is_up(self) -> bool:
        running = running_engine()
        return bool(running) and same_model(running[0], self.engine_kwargs["model"])

    def close(self) -> None:
        shutdown_engine()


class ServerSampler(Sampler):
    """Requests to a running OpenAI-compatible server."""

    def __init__(self, sampling: SamplingConfig, server: ServerConfig, model: str):
        super().__init__(sampling)
        self.server, self.model = server, model

    def generate(self, prompts, messages, n):
        srv = self.server
        return sample_server(
            srv.base_url,
            self.model,
            list(prompts),
            list(messages),
            k=n,
            concurrency=srv.concurrency,
            retries=srv.retries,
            timeout=srv.timeout_s,
            api_key=os.environ.get(srv.api_key_env) if srv.api_key_env else None,
            vllm_extensions=srv.vllm_extensions,
            **self.params,
        )

    def generate_with_tools(self, prompts, messages, n):
        srv, p = self.server, self.params
        step = server_step(
            srv.base_url,
            self.model,
            list(prompts),
            list(messages),
            concurrency=srv.concurrency,
            retries=srv.retries,
            timeout=srv.timeout_s,
            api_key=os.environ.get(srv.api_key_env) if srv.api_key_env else None,
            vllm_extensions=srv.vllm_extensions,
            **p,
        )
        return sample_with_tools(
            step, len(prompts), n, self.tools, max_tokens=p["max_tokens"], stop=p["stop"]
        )


class RayPool(Sampler):
    """Long-lived engines on a Ray cluster (started on first use); one batch per engine in
    flight, plus one queued, so the engines never wait while this process verifies."""

    def __init__(
        self, sampling: SamplingConfig, ray: RayConfig, engine: dict[str, Any], lora: str | None
    ):
        super().__init__(sampling)
        # the engines run in other processes and on other nodes: absolute paths
        self.ray, self.engine_kwargs = ray, engine | {"model": _absolute(engine["model"])}
        self.lora = lora and _absolute(lora)
        self.in_flight = engine_count(ray) + 1

    def generate(self, prompts, messages, n):
        pool = engine_pool(self.ray, self.engine_kwargs)
        return pool.sample(prompts, messages, n, self.params, self.lora)

    def generate_with_tools(self, prompts, messages, n):
        # the whole loop runs beside its engine, the code in that node's sandbox
        pool = engine_pool(self.ray, self.engine_kwargs)
        return pool.sample(prompts, messages, n, self.params, self.lora, self.tools)

    def is_up(self) -> bool:
        return current_pool() is not None

    def stats(self) -> dict[str, Any]:
        pool = current_pool()
        return {"executor": "ray", "engines": pool.size if pool else 0} | (
            {"batches_per_engine": list(pool.batches)} if pool else {}
        )

    def close(self) -> None:
        shutdown_pool()


_OPEN: dict[str, Sampler] = {}  # what this process made, closed by `shutdown`


def _kept(key: list, make: Callable[[], Sampler]) -> Sampler:
    text = json.dumps(key, sort_keys=True, default=str)
    if text not in _OPEN:
        _OPEN[text] = make()
    return _OPEN[text]


def sampler_for(
    cfg: CurateConfig | EvalConfig, before_engine: Callable[[], None] | None = None
) -> Sampler:
    """The config's sampler, made once per process and settings; a local engine starts on
    first use (after `before_engine`) and stays up until `shutdown`."""
    where, s = cfg.placement, cfg.sampling
    # k is not the sampler's: each call says how many samples it wants
    key = [where, cfg.model, cfg.lora, s.model_dump(exclude={"k"}), cfg.engine.model_dump()]
    key += [cfg.server and cfg.server.model_dump(), cfg.ray.model_dump()]
    makers: dict[str, Callable[[], Sampler]] = {
        "local": lambda: LocalEngine(s, engine_kwargs(cfg), cfg.lora),
        "server": lambda: ServerSampler(s, cfg.server, cfg.model),
        "ray": lambda: RayPool(s, cfg.ray, engine_kwargs(cfg), cfg.lora),
    }
    sampler = _kept(key, makers[where])
    if isinstance(sampler, LocalEngine):
        sampler.before_engine = before_engine
    return sampler


def sampler_at(
    model: str,
    sampling: SamplingConfig,
    server: ServerConfig | None = None,
    engine: dict[str, Any] | None = None,
) -> Sampler:
    """A sampler of `model` for a verifier that generates (a judge): on `server` when one is
    given (`model` is its served name), else on this process's engine (shared with
    sampling when that serves the same model)."""
    if server is not None:
        key = ["server", model, sampling.model_dump(), server.model_dump()]
        return _kept(key, lambda: ServerSampler(sampling, server, model))
    kwargs = {"model": model, **(engine or {})}
    key = ["local", kwargs, sampling.model_dump()]
    return _kept(key, lambda: LocalEngine(sampling, kwargs, share=True))


def shutdown() -> None:
    """Close every sampler this process made (its engine, its Ray pool)."""
    samplers = list(_OPEN.values())
    _OPEN.clear()
    try:
        for sampler in samplers:
            sampler.close()
    finally:
        shutdown_engine()  # the process's one engine, whoever started it


def same_model(a: str, b: str) -> bool:
    """Whether two model names are the same name or the same existing folder."""
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def _absolute(path: str) -> str:
    return str(Path(path).absolute()) if Path(path).exists() else path


def engine_kwargs(cfg: CurateConfig | EvalConfig) -> dict[str, Any]:
    """The arguments of `get_engine` for this config."""
    engine = cfg.engine
    return dict(
        model=cfg.model,
        seed=cfg.sampling.seed,
        dtype=engine.dtype,
        max_model_len=engine.max_model_len,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        enforce_eager=engine.enforce_eager,
        max_lora_rank=lora_rank(cfg.lora) if cfg.lora else None,
        extra=engine.extra,
    )


def local_engine(
    cfg: CurateConfig | EvalConfig, before_engine: Callable[[], None] | None = None
) -> LLM:
    """This process's vLLM engine for the config (started on first use, after
    `before_engine`)."""
    if before_engine is not None:
        before_engine()
    return get_engine(**engine_kwargs(cfg))
