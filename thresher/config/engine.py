"""The sampling sections: which prompts, how they are sampled, and where the engine runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from thresher.config.base import StageConfig, _Strict, never, skipped_by


def model_id(model: str, lora: str | None) -> str:
    """What a candidate's `model` column records: the model, plus the adapter when there is
    one (a curate run and an evaluation of the same model share their candidates)."""
    return f"{model}+lora:{lora}" if lora else model


class PromptsConfig(_Strict):
    """Which prompts to curate."""

    counted_at_default = frozenset({"dataset", "split", "task", "limit"})

    dataset: str
    split: Literal["train", "eval", "test"] = Field(
        "train", description="test is sealed: only a final evaluation reads it"
    )
    task: str | None = Field(None, description="only prompts of this task")
    limit: int | None = Field(None, ge=1, description="at most this many prompts")


class ToolsConfig(_Strict):
    """A code tool the model may call while it answers: generation stops at the end of a code
    block, the code runs in the code verifier's sandbox, its output is appended and the
    model goes on."""

    counted_at_default = frozenset(
        {"open", "close", "output", "max_calls", "max_total_tokens", "output_chars"}
        | {"timeout_s", "memory_mb"}
    )

    open: str = Field("```python", description="what starts a code block the tool runs")
    close: str = Field("```", description="what ends it (the code runs when the model writes it)")
    output: str = Field(
        "\n```output\n{output}\n```\n",
        description="how the tool's output is appended ({output}: what the code printed, "
        "or its error as the interpreter prints it)",
    )
    max_calls: int = Field(
        4, ge=1, description="code runs per candidate; opening one more ends it (max_calls)"
    )
    max_total_tokens: int | None = Field(
        None,
        ge=1,
        description="tokens after the prompt, the tool's output included, checked before each "
        "step (then the candidate ends: budget); the model's own tokens stay within "
        "sampling.max_tokens over all its turns",
    )
    output_chars: int = Field(1000, ge=16, description="longest output appended (then cut)")
    timeout_s: float = Field(5.0, gt=0, description="time one code run may take")
    memory_mb: int = Field(512, ge=64, description="memory one code run may take")
    workers: int | None = never(
        default=None, ge=1, description="sandboxes running code at once (default: every CPU)"
    )

    @model_validator(mode="after")
    def _output_has_slot(self) -> ToolsConfig:
        if "{output}" not in self.output:
            raise ValueError("tools.output must contain {output}, where the tool's output goes")
        if not self.open or not self.close:
            raise ValueError("tools.open and tools.close must not be empty")
        return self


class SamplingConfig(_Strict):
    """How candidates are sampled (k per prompt)."""

    counted_at_default = frozenset(
        {"k", "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "chat"}
    )

    # a candidate is the same whatever k: raising k tops a prompt up
    k: int = skipped_by("candidate", default=8, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.9, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 turns top-k off")
    max_tokens: int = Field(512, ge=1)
    stop: list[str] = Field(
        default_factory=list,
        description='strings that end an answer, kept in it (e.g. ["</answer>"])',
    )
    seed: int = Field(0, description="engine seed (vLLM's LLM(seed=...))")
    chat: bool = Field(
        True,
        description="send plain prompts as a user message through the chat template "
        "(as training renders them); false: the raw text",
    )
    # a candidate is the same however k is reached: chunks tops a prompt up in steps
    chunk: int | None = skipped_by(
        "candidate",
        default=None,
        ge=1,
        description="sample k in chunks of this many, verifying between them: a prompt stops "
        "once more samples cannot change how many selection keeps of it (select.cap distinct "
        "passing answers and, with select.max_pass_rate, failures enough that it cannot be "
        "too easy; or already too easy whatever comes next); unset: k at once",
    )

    tools: ToolsConfig | None = Field(
        None, description="let the model run code while it answers (off when unset)"
    )

    @model_validator(mode="after")
    def _greedy_means_one(self) -> SamplingConfig:
        if self.temperature == 0 and self.k > 1:
            raise ValueError("temperature 0 is greedy: every sample would be the same; use k: 1")
        return self


class EngineConfig(_Strict):
    """vLLM engine settings; unset ones take defaults suited to the machine."""

    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    enforce_eager: bool | None = None
    extra: dict[str, Any] = Field(default_factory=dict, description="more vllm.LLM arguments")


class ServerConfig(_Strict):
    """Sample from a running OpenAI-compatible server instead of a local engine."""

    counted_at_default = frozenset(
        {"base_url", "concurrency", "retries", "timeout_s", "api_key_env", "vllm_extensions"}
    )

    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1")
    concurrency: int = Field(16, ge=1, description="requests in flight at once")
    retries: int = Field(5, ge=0, description="retries on connection errors, 429 and 5xx")
    timeout_s: float = Field(600, gt=0)
    api_key_env: str | None = Field(None, description="environment variable with the API key")
    vllm_extensions: bool = Field(True, description="send vLLM's return_token_ids and top_k")


class RayConfig(_Strict):
    """Where and how `executor: ray` runs sampling and verification."""

    address: str | None = Field(
        None,
        description="a running cluster (host:port, or ray://host:10001); default: "
        "$RAY_ADDRESS, else the cluster last started here with `ray start`, else a Ray "
        "instance for this process",
    )
    engines: int | None = Field(
        None, ge=1, description="vLLM engines (actors); default: one per GPU, 1 without GPUs"
    )
    gpus_per_engine: float = Field(
        1, ge=0, description="GPUs each engine reserves (tensor_parallel_size in engine.extra)"
    )
    cpus_per_engine: float = Field(1, ge=0, description="CPUs each engine reserves")
    verify_chunk: int = Field(
        512, ge=1, description="candidates per verification task spread over the cluster"
    )


Executor = Literal["local", "ray"]
EXECUTOR_HELP = "local: one engine in this process; ray: engines and verifiers on a Ray cluster"


class CompactConfig(_Strict):
    """Compaction of the lake's small files while a pipeline runs (`thresher compact`)."""

    after_small_files: int = Field(
        500,
        ge=0,
        description="compact a table once it has this many files under half the target "
        "size (checked every 100 batches and at the end of a run); 0: never",
    )
    target_file_mb: int = Field(128, ge=1, description="size of the compacted files, MiB")


class EngineStage(StageConfig):
    """The fields of the stages that sample with an engine (curate, evaluate, bootstrap)."""

    counted_at_default = frozenset({"sampling"})

    # where and how fast the work runs, not what it produces
    batch_size: int = never(default=256, ge=1, description="prompts per sampling batch (one task)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    engine: EngineConfig = never(default_factory=EngineConfig)
    executor: Executor = never(default="local", description=EXECUTOR_HELP)
    ray: RayConfig = never(default_factory=RayConfig)
    compact: CompactConfig = never(default_factory=CompactConfig)
    timeout_s: float | None = never(
        default=None, gt=0, description="most seconds one batch's sampling may take (then retried)"
    )

    def runtime(self) -> dict[str, Any]:
        """The fields every engine stage shares (what a derived stage's config inherits)."""
        return {f: getattr(self, f) for f in EngineStage.model_fields if f != "name"}
