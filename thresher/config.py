"""Pipeline configs: one YAML file per pipeline, checked by pydantic.

The work packages take these models directly (a trainer takes `TrainSettings`, selection
`SelectConfig`, a sampler the sampling, engine, server and ray sections); flows build them
from YAML and pass them on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageConfig(_Strict):
    """The fields every stage's config has."""

    name: str = Field(
        description="the pipeline's name: runs, reports and models are filed under it"
    )
    lake: str | None = Field(None, description="lake folder or URL (else --lake / THRESHER_LAKE)")


class PromptsConfig(_Strict):
    """Which prompts to curate."""

    dataset: str
    split: Literal["train", "eval", "test"] = Field(
        "train", description="test is sealed: only a final evaluation reads it"
    )
    task: str | None = Field(None, description="only prompts of this task")
    limit: int | None = Field(None, ge=1, description="at most this many prompts")


class SamplingConfig(_Strict):
    """How candidates are sampled (k per prompt)."""

    k: int = Field(8, ge=1)
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

    batch_size: int = Field(256, ge=1, description="prompts per sampling batch (one task)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    executor: Executor = Field("local", description=EXECUTOR_HELP)
    ray: RayConfig = Field(default_factory=RayConfig)
    compact: CompactConfig = Field(default_factory=CompactConfig)
    timeout_s: float | None = Field(
        None, gt=0, description="most seconds one batch's sampling may take (then retried)"
    )

    def runtime(self) -> dict[str, Any]:
        """The fields every engine stage shares (what a derived stage's config inherits)."""
        return {f: getattr(self, f) for f in EngineStage.model_fields if f != "name"}


class VerifyConfig(_Strict):
    """Which verifiers score the candidates, and which verdicts make a candidate pass."""

    verifiers: list[str] = Field(
        default_factory=lambda: ["exact"],
        min_length=1,
        description="verifiers for every prompt (unless by_task names its task)",
    )
    by_task: dict[str, list[str]] = Field(
        default_factory=dict, description="task -> verifiers for prompts of that task"
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="verifier -> its options, e.g. code: {timeout_s: 5}"
    )
    rule: str | None = Field(
        None, description='e.g. "math and format"; default: every verdict passed'
    )

    @model_validator(mode="after")
    def _known_names(self) -> VerifyConfig:
        from thresher.rules import rule_names
        from thresher.verifiers import registry, verifier_name

        known = set(registry())
        used = set(self.verifiers) | {n for names in self.by_task.values() for n in names}
        # `module.path:ClassName` names a user's verifier, imported here
        unknown = {n for n in used | set(self.options) if n not in known and ":" not in n}
        if unknown:
            raise ValueError(
                f"unknown verifier(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
            )
        imported = {n for n in used | set(self.options) if ":" in n}
        if imported:
            # from here on it goes by its class's `name`, as in rules and verdict rows
            try:
                named = {n: verifier_name(n) for n in imported}
            except KeyError as e:
                raise ValueError(e.args[0]) from None

            def canonical(names: list[str]) -> list[str]:
                return list(dict.fromkeys(named.get(n, n) for n in names))

            self.verifiers = canonical(self.verifiers)
            self.by_task = {task: canonical(names) for task, names in self.by_task.items()}
            options: dict[str, dict[str, Any]] = {}
            for n, opts in self.options.items():
                if named.get(n, n) in options:
                    raise ValueError(f"options for verifier {named.get(n, n)!r} given twice")
                options[named.get(n, n)] = opts
            self.options = options
            used = {named.get(n, n) for n in used}
        if self.rule:
            missing = rule_names(self.rule) - used
            if missing:
                raise ValueError(f"rule names verifiers that never run: {sorted(missing)}")
        return self

    def with_reference(self) -> VerifyConfig:
        """These settings less the verifiers that judge without a reference (format, regex,
        majority, reward): what may decide held-out metrics. ValueError when a list keeps
        none, saying which."""
        from thresher.verifiers import traits

        def kept(names: list[str], where: str) -> list[str]:
            out = [n for n in names if traits(n)["uses_reference"]]
            if not out:
                raise ValueError(
                    f"held-out evaluation would rest only on {', '.join(names)} ({where}), "
                    "which judge without a reference: the round would be measured by the "
                    "signal it trained on. Set eval.verify to a verifier that checks the "
                    "prompt's reference (math, exact, choice, code, judge or reasoning_gym)"
                )
            return out

        verifiers = kept(self.verifiers, "verifiers")
        by_task = {t: kept(names, f"by_task.{t}") for t, names in self.by_task.items()}
        used = set(verifiers) | {n for names in by_task.values() for n in names}
        options = {n: o for n, o in self.options.items() if n in used}
        # no rule carried over: a training rule may negate or excuse a reference check
        return VerifyConfig(verifiers=verifiers, by_task=by_task, options=options)

    def for_task(self, task: str) -> list[str]:
        """The verifiers that score candidates of prompts of `task`."""
        return self.by_task.get(task, self.verifiers)

    def all_names(self) -> list[str]:
        """Every verifier some prompt uses, in a stable order."""
        names = list(self.verifiers)
        for task_names in self.by_task.values():
            names += [n for n in task_names if n not in names]
        return names


class DecontamConfig(_Strict):
    """Keep evaluation items out of training data."""

    enabled: bool = True
    eval_datasets: list[str] | None = Field(
        None, description="datasets whose eval split is checked (default: every dataset)"
    )
    files: list[str] = Field(default_factory=list, description="more JSONL/text files to check")
    ngram: int = Field(13, ge=1, description="word n-gram overlap that counts as contamination")
    exact: bool = Field(
        False,
        description="only a whole text equal to an eval item (case and spacing aside) counts: "
        "for templated tasks, whose different questions share long n-grams",
    )
    minhash_threshold: float | None = Field(
        None, gt=0, lt=1, description="also drop near matches at this estimated Jaccard"
    )

    @model_serializer(mode="wrap")
    def _ngram_keys_as_before(self, handler):
        # n-gram matching (the default) dumps, and so identifies selections, as before `exact`
        out = handler(self)
        if isinstance(out, dict) and not self.exact:
            out.pop("exact", None)
        return out


class SelectConfig(_Strict):
    """What survives: failures, easy prompts, contamination and duplicates are dropped,
    then at most `cap` candidates per prompt are kept, chosen by `policy`."""

    cap: int = Field(4, ge=1, description="most candidates kept per prompt")
    keep_truncated: bool = Field(
        False,
        description="keep passing candidates cut at max_tokens (by default dropped as "
        "`truncated`: trained with an end-of-sequence token, they teach the model to stop "
        "mid-thought)",
    )
    policy: Literal["diverse", "shortest", "top_score", "random", "first"] = Field(
        "diverse", description="which candidates the cap keeps"
    )
    seed: int = Field(0, description="seed of the random policy")
    lowercase: bool = Field(False, description="case-insensitive duplicate detection")
    near_dup: bool = Field(True, description="MinHash LSH near-duplicate removal")
    threshold: float = Field(0.8, gt=0, lt=1, description="near-duplicate Jaccard threshold")
    num_perm: int = Field(128, ge=16)
    shingle_size: int = Field(5, ge=1, description="words per shingle")
    across_prompts: bool = Field(False, description="near-duplicates across prompts too")
    max_pass_rate: float | None = Field(
        None, ge=0, le=1, description="drop prompts solved more often than this (too easy)"
    )
    decontaminate: DecontamConfig = Field(default_factory=DecontamConfig)
    min_test_strength: float | None = Field(
        None,
        ge=0,
        le=1,
        description="drop candidates of code prompts whose tests kill fewer than this share "
        "of the reference's mutants (`thresher tests-audit`; a prompt never audited is "
        "dropped too), as `weak_tests`",
    )

    @model_serializer(mode="wrap")
    def _keys_as_before(self, handler):
        # unset, it dumps (and so identifies selections) as before it existed
        out = handler(self)
        if isinstance(out, dict) and self.min_test_strength is None:
            out.pop("min_test_strength", None)
        return out


class GatesConfig(_Strict):
    """Checks that decide whether a pipeline may run, not what it makes: left out of the
    selection's and the run's identity, so changing them neither resamples nor reselects."""

    min_pairwise_accuracy: float = Field(
        0.85,
        ge=0,
        le=1,
        description="a pipeline using the `reward` verifier runs only when its reward model's "
        "latest `thresher rm-check` measured at least this pairwise accuracy on held-out "
        "preference pairs (a gate: it changes nothing selected)",
    )
    force_reward_model: bool = Field(
        False,
        description="run with the reward model even when it was never checked or its "
        "pairwise accuracy is below min_pairwise_accuracy (the run's summary records it)",
    )


def gates_moved_out_of_select(data: Any) -> Any:
    """Configs written before the gates had a section of their own still load."""
    if not isinstance(data, dict) or not isinstance(data.get("select"), dict):
        return data
    moved = {k: data["select"][k] for k in GatesConfig.model_fields if k in data["select"]}
    if not moved:
        return data
    import warnings

    warnings.warn(
        f"select.{', select.'.join(moved)} moved to gates: (read from select this time)",
        FutureWarning,
        stacklevel=2,
    )
    select = {k: v for k, v in data["select"].items() if k not in moved}
    return {**data, "select": select, "gates": {**moved, **(data.get("gates") or {})}}


class DifficultyConfig(_Strict):
    """Difficulty-aware sampling, from pass rates this pipeline measured in earlier rounds."""

    skip_solved_above: float | None = Field(
        None, ge=0, le=1, description="skip prompts last solved at this rate or more"
    )
    hard_below: float | None = Field(
        None, ge=0, le=1, description="prompts last solved at a lower rate than this ..."
    )
    hard_k: int | None = Field(None, ge=1, description="... get this many candidates")
    retire_after: int | None = Field(
        None,
        ge=1,
        description="stop sampling a prompt that had no passing candidate in this many "
        "curated rounds in a row (it carries no signal; view retired_prompts lists them)",
    )
    min_pass_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="the band of pass rates that carries signal: a prompt solved more often "
        "than this ...",
    )
    max_pass_rate: float = Field(
        1.0,
        ge=0,
        le=1,
        description="... and less often than this; reported as the share of prompts in the "
        "band (nothing is dropped for it)",
    )

    @model_validator(mode="after")
    def _hard_pair(self) -> DifficultyConfig:
        if (self.hard_below is None) != (self.hard_k is None):
            raise ValueError("hard_below and hard_k go together")
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError("min_pass_rate must be below max_pass_rate")
        return self

    def identity(self) -> dict[str, Any]:
        """What of these settings changes which candidates are sampled: the band only
        reports, and retire_after counts only when set."""
        out = self.model_dump(exclude={"min_pass_rate", "max_pass_rate"})
        if self.retire_after is None:
            del out["retire_after"]
        return out

    def in_band(self, rate: float) -> bool:
        """Whether a prompt solved at `rate` carries signal (strictly inside the band)."""
        return self.min_pass_rate < rate < self.max_pass_rate


class RationalizeConfig(_Strict):
    """STaR rationalization: prompts with no passing candidate are sampled again with
    the reference answer as a hint; passing hinted candidates train without the hint."""

    enabled: bool = False
    k: int = Field(4, ge=1, description="hinted candidates per unsolved prompt")
    hint: str = Field(
        "{prompt} (Hint: the answer is {answer}.)",
        description="the hinted prompt; {prompt} and {answer} are filled in",
    )
    max_share: float | None = Field(
        0.5, gt=0, le=1, description="most hinted candidates among those kept (per batch)"
    )

    @model_validator(mode="after")
    def _hint_fields(self) -> RationalizeConfig:
        if "{answer}" not in self.hint or "{prompt}" not in self.hint:
            raise ValueError("hint must contain {prompt} and {answer}")
        return self


SEALED = (
    "the test split is sealed: curate, train, bootstrap and audits never read it; open it "
    "with a final evaluation (`thresher eval --split test --final`), which is recorded"
)


class GatedStage(EngineStage):
    """An engine stage with gates: checks that decide whether it may run at all."""

    gates: GatesConfig = Field(default_factory=GatesConfig)

    @model_validator(mode="before")
    @classmethod
    def _gates_section(cls, data: Any) -> Any:
        return gates_moved_out_of_select(data)


class CurateConfig(GatedStage):
    """A curate pipeline: sample, verify and select one round."""

    model: str = Field(description="a local model folder vLLM can load (or the server's name)")
    lora: str | None = Field(None, description="a LoRA adapter folder applied to `model`")
    round: int = Field(0, ge=0)
    prompts: PromptsConfig
    server: ServerConfig | None = None
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    difficulty: DifficultyConfig = Field(default_factory=DifficultyConfig)
    rationalize: RationalizeConfig = Field(default_factory=RationalizeConfig)

    @model_validator(mode="after")
    def _test_split_is_sealed(self, info: ValidationInfo) -> CurateConfig:
        if self.prompts.split == "test" and not (info.context or {}).get("open_test"):
            raise ValueError(SEALED)
        return self

    @model_validator(mode="after")
    def _lora_needs_local_engine(self) -> CurateConfig:
        if self.lora and self.server:
            raise ValueError("lora applies to the local engine; a server loads adapters itself")
        if self.server and self.executor != "local":
            raise ValueError("executor: ray runs its own engines; it does not apply to a server")
        _judge_shares_the_engine(self)
        return self

    @property
    def placement(self) -> Literal["local", "server", "ray"]:
        """Where sampling runs: a server when one is set, else the executor's engines."""
        return "server" if self.server else self.executor

    @property
    def model_id(self) -> str:
        """What the `model` column records: the model, plus the adapter when there is one."""
        return f"{self.model}+lora:{self.lora}" if self.lora else self.model


def _judge_shares_the_engine(cfg: CurateConfig) -> None:
    """A local `judge` model runs on the process's one engine: it must be the sampling
    model, else every batch would swap engines (a minute each); a judge of another model
    belongs on a server (judge.server)."""
    opts = cfg.verify.options.get("judge") or {}
    if "judge" not in cfg.verify.all_names() or opts.get("server") or not opts.get("model"):
        return
    same = Path(str(opts["model"])).resolve() == Path(cfg.model).resolve()
    if cfg.placement != "local" or not same:
        raise ValueError(
            "a local judge model shares this process's one engine with sampling, so it must "
            "be the model that samples with a local engine; serve the judge model (e.g. "
            "`vllm serve`) and set verify.options.judge.server and served_model instead"
        )


class TrainDataConfig(_Strict):
    """What to train on: a round's kept data in the lake, or a dataset on disk."""

    round: int | None = Field(0, ge=0, description="kept candidates of this round")
    all_rounds: bool = Field(True, description="rounds 0..round together (STaR default)")
    pipeline: str | None = Field(None, description="only data this curate pipeline (name) kept")
    path: str | None = Field(
        None, description="instead: a datasets folder or JSONL (messages or prompt+completion)"
    )


class LoraConfig(_Strict):
    r: int = Field(64, ge=1)
    alpha: int = Field(128, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class DistributedConfig(_Strict):
    """Training in several processes on this machine (one per GPU) under torchrun."""

    processes: int = Field(
        1,
        ge=1,
        description="training processes, one per GPU; 1 trains inside the flow's own "
        "process, more start `torchrun --standalone --nproc_per_node N`",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: a whole model copy per process; fsdp: weights, gradients and "
        "optimizer state sharded over the processes (models that do not fit one GPU)",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="process-group backend; auto: nccl with GPUs, gloo without"
    )


class EarlyStoppingConfig(_Strict):
    """Stop training once the held-out loss stops improving (SFT memorises), keeping the
    weights of the best step."""

    patience: int = Field(3, ge=1, description="evaluations in a row without improvement")
    min_delta: float = Field(0.0, ge=0, description="an improvement smaller than this is none")


# -- training mixtures (train.mix) --------------------------------------------------

SELF = "self"  # a mix source `pipeline: self`: the rows this config trains on without a mix


class MixSource(_Strict):
    """One source of a training mixture: exactly one of `pipeline`, `dataset` or `path`,
    and its weight (its share of the mixed rows is weight / the sum of the weights)."""

    pipeline: str | None = Field(
        None,
        description="kept data of this curate/bootstrap pipeline; `self`: this config's own "
        "data (a bootstrap's rounds, a train config's `data`)",
    )
    rounds: Literal["all", "latest"] | None = Field(
        None,
        description="pipeline sources: every kept round, or only the latest one; default: "
        "all (for `self`, as all_rounds says)",
    )
    dataset: str | None = Field(
        None, description="a prompts dataset (train split) whose rows carry a reference response"
    )
    response: str = Field(
        "answer",
        description="dataset sources: where the response is: `answer` or `meta.<key>` "
        "(e.g. meta.solution of the gsm8k preset)",
    )
    path: str | None = Field(
        None,
        description="a JSONL file or `datasets` folder with prompt/response, prompt/completion "
        "or messages rows: ingested into the lake (preset sft), then read as a dataset",
    )
    ingest_as: str | None = Field(
        None, description="path sources: the dataset name it is ingested as (default: its stem)"
    )
    weight: float = Field(gt=0, description="relative weight; shares are weight / sum")
    on_short: Literal["repeat", "refuse"] = Field(
        "repeat",
        description="when the source has fewer rows than its share needs: repeat them (a "
        "seeded shuffle, cycled) or refuse to train",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> MixSource:
        given = [k for k in ("pipeline", "dataset", "path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a mix source names exactly one of pipeline, dataset or path"
                + (f" (got {' and '.join(given)})" if given else "")
            )
        if self.rounds is not None and self.pipeline is None:
            raise ValueError("rounds applies to pipeline sources only")
        if self.ingest_as is not None and self.path is None:
            raise ValueError("ingest_as applies to path sources only")
        if self.response != "answer" and self.dataset is None:
            raise ValueError("response applies to dataset sources only")
        if self.response != "answer" and not (
            self.response.startswith("meta.") and len(self.response) > 5
        ):
            raise ValueError("response must be `answer` or `meta.<key>`")
        return self

    @property
    def is_self(self) -> bool:
        return self.pipeline == SELF

    @property
    def outside_selection(self) -> bool:
        """Rows that no selection screened (a dataset's or a file's), so the mix must."""
        return self.dataset is not None or self.path is not None

    @property
    def dataset_name(self) -> str | None:
        """The prompts dataset this source reads (a path source's, once ingested)."""
        if self.path is not None:
            return self.ingest_as or Path(self.path).name.split(".")[0]
        return self.dataset

    @property
    def label(self) -> str:
        """How the source is named in the run's summary, the train_mix view and the report."""
        if self.pipeline is not None:
            return f"pipeline:{self.pipeline}" + (f" ({self.rounds})" if self.rounds else "")
        if self.dataset is not None:
            return f"dataset:{self.dataset}" + (
                f" ({self.response})" if self.response != "answer" else ""
            )
        return f"path:{self.path}"


def _check_mix(mix: list[MixSource] | None, mix_rows: int | None) -> None:
    if mix is None:
        if mix_rows is not None:
            raise ValueError("mix_rows sizes a mix: set mix too")
        return
    if not mix:
        raise ValueError("mix needs at least one source (or leave it out)")
    labels = [s.label for s in mix]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"mix names a source twice: {', '.join(twice)}")


class TrainSettings(_Strict):
    """How a model is fine-tuned: SFT, loss on answer tokens only."""

    init: Literal["base", "previous"] = Field(
        "base", description="start from base_model, or continue from round's model"
    )
    method: Literal["lora", "full"] = "lora"
    lora: LoraConfig = Field(default_factory=LoraConfig)
    learning_rate: float | None = Field(None, gt=0, description="default 2e-4 LoRA, 2e-5 full")
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(
        8, ge=1, description="examples per micro-batch over all processes (the global batch)"
    )
    grad_accum: int = Field(1, ge=1)
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    max_len: int = Field(1024, ge=8)
    eval_fraction: float = Field(0.05, ge=0, lt=1)
    eval_every: int = Field(50, ge=1)
    save_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = 0
    output: Literal["merged", "adapter", "both"] = "merged"
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    early_stopping: EarlyStoppingConfig | None = Field(
        None,
        description="stop on eval loss (every eval_every steps; needs eval_fraction > 0) "
        "and keep the best step's weights",
    )

    packing: bool = Field(
        True,
        description="pack each micro-batch's examples into as few rows as fit in its longest "
        "example's length (best-fit decreasing), each example with its own positions and no "
        "attention across examples: the same loss and gradients with less padding (how rows "
        "are laid out, not what is learned: not part of a run's identity)",
    )

    mix: list[MixSource] | None = Field(
        None,
        description="train on a weighted mixture of sources instead of `data` alone "
        "(`pipeline: self` is that data); unset: no mixture",
    )
    mix_rows: int | None = Field(
        None,
        ge=1,
        description="rows of the mixture; default: all of `self`'s rows (used once) over its "
        "share, else as many as no source needs repeating for",
    )

    @model_serializer(mode="wrap")
    def _no_mix_no_keys(self, handler):
        # configs without a mix (or with packing as by default) dump, and so identify their
        # runs, as before those settings existed
        out = handler(self)
        if isinstance(out, dict):
            if self.mix is None:
                out.pop("mix", None)
                out.pop("mix_rows", None)
            if self.packing:
                out.pop("packing", None)
        return out

    @model_validator(mode="after")
    def _every_process_gets_rows(self) -> TrainSettings:
        _check_mix(self.mix, self.mix_rows)
        if self.early_stopping is not None and self.eval_fraction == 0:
            raise ValueError("early_stopping watches eval loss: set eval_fraction above 0")
        if self.distributed.processes > self.batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) is the global batch: it must be at least "
                f"distributed.processes ({self.distributed.processes})"
            )
        return self


class TrainConfig(TrainSettings, StageConfig):
    """A training run: SFT of `base_model` on selected data, loss on answer tokens only."""

    base_model: str = Field(description="local model folder")
    round: int = Field(0, ge=0, description="the round whose data trains model round+1")
    data: TrainDataConfig = Field(default_factory=TrainDataConfig)
    out: str | None = Field(
        None,
        description="default: <lake>/models/<name>/round-<round+1> "
        "(./models/... for a remote lake)",
    )


class EvalConfig(EngineStage):
    """Held-out evaluation: n samples per prompt, verified, summarised as pass@k."""

    name: str = "eval"
    model: str
    lora: str | None = None
    round: int = Field(0, ge=0, description="the round this model belongs to")
    prompts: PromptsConfig
    n: int = Field(8, ge=1, description="samples per prompt")
    ks: list[int] = Field(default_factory=lambda: [1, 8], min_length=1)
    verify: VerifyConfig = Field(default_factory=lambda: VerifyConfig(verifiers=["math"]))
    final: bool = Field(
        False, description="open the sealed test split (each opening is recorded as a run)"
    )

    @model_validator(mode="after")
    def _ks_fit(self) -> EvalConfig:
        if max(self.ks) > self.n:
            raise ValueError(f"pass@{max(self.ks)} needs n >= {max(self.ks)} samples per prompt")
        if (self.prompts.split == "test") != self.final:
            raise ValueError(
                SEALED if not self.final else "final evaluations are of the test split"
            )
        return self

    def as_curate(self) -> CurateConfig:
        """The sampling and verifying part, as a curate config (nothing is selected)."""
        sampling = self.sampling.model_copy(update={"k": self.n})
        if self.n > 1 and sampling.temperature == 0:
            raise ValueError("n > 1 samples need a temperature above 0")
        return CurateConfig.model_validate(
            self.runtime()
            | {
                "sampling": sampling,
                "name": f"eval:{self.name}",
                "model": self.model,
                "lora": self.lora,
                "round": self.round,
                "prompts": self.prompts,
                "verify": self.verify,
            },
            context={"open_test": self.final},  # a final evaluation opens the test split
        )


class BootstrapTrainConfig(TrainSettings):
    """Training in each round (the fields of a train config, without the pipeline ones)."""

    all_rounds: bool = Field(True, description="train on rounds 0..r's kept data (STaR)")

    @model_validator(mode="after")
    def _mix_keeps_the_rounds(self) -> BootstrapTrainConfig:
        if self.mix is not None and not any(s.is_self for s in self.mix):
            raise ValueError(
                "a bootstrap trains on its rounds' kept data: train.mix needs a "
                "`pipeline: self` source"
            )
        return self


class ForgettingCheckConfig(_Strict):
    """Another held-out set evaluated every round beside the main one: a skill the rounds
    must not cost (general knowledge, another task), measured against the base model."""

    dataset: str
    split: Literal["train", "eval", "test"] = Field(
        "eval", description="a split the bootstrap does not train on (test is sealed)"
    )
    task: str | None = Field(None, description="only prompts of this task")
    limit: int | None = Field(None, ge=1, description="at most this many prompts")
    verify: VerifyConfig | None = Field(
        None, description="its verifiers (default: those of the main held-out evaluation)"
    )
    max_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="stop the run when a round's model scores pass@1 lower than the base "
        "model by more than this (unset: measured and reported only)",
    )

    @model_validator(mode="after")
    def _not_sealed(self) -> ForgettingCheckConfig:
        if self.split == "test":
            raise ValueError(SEALED)
        return self

    def prompts(self) -> PromptsConfig:
        """The prompts it evaluates."""
        return PromptsConfig(
            dataset=self.dataset, split=self.split, task=self.task, limit=self.limit
        )

    def label(self) -> str:
        """e.g. 'general/eval' or 'arith/eval/add': how reports and messages name it."""
        return "/".join(p for p in (self.dataset, self.split, self.task) if p)


class BootstrapEvalConfig(_Strict):
    """Held-out evaluation of every round's model."""

    prompts: PromptsConfig
    n: int = Field(8, ge=1, description="samples per prompt")
    ks: list[int] = Field(default_factory=lambda: [1, 8], min_length=1)
    temperature: float | None = Field(None, ge=0, description="default: sampling.temperature")
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    verify: VerifyConfig | None = Field(
        None,
        description="verifiers of the held-out metrics (and so of the stop rule, rollback "
        "and report); default: training's verifiers that check a reference (math, exact, "
        "choice, code, judge, reasoning_gym), every one of them passing (training's rule is "
        "not used)",
    )
    also: list[ForgettingCheckConfig] = Field(
        default_factory=list,
        description="more held-out sets evaluated every round (forgetting checks); a drop "
        "of pass@1 beyond max_drop against the base model stops the run",
    )

    @model_validator(mode="after")
    def _ks_fit(self) -> BootstrapEvalConfig:
        if max(self.ks) > self.n:
            raise ValueError(f"pass@{max(self.ks)} needs n >= {max(self.ks)} samples per prompt")
        if self.prompts.split != "eval":
            raise ValueError("evaluation prompts must be an eval split (held out from training)")
        return self


class RollbackConfig(_Strict):
    """Sample the next round with the best model so far when the newest one regressed."""

    enabled: bool = True
    tolerance: float = Field(
        0.02,
        ge=0,
        description="a drop of held-out pass@1 below the best model's by more than this is "
        "a regression: the next round samples with the best model instead",
    )


class AuditGateConfig(_Strict):
    """Stop a bootstrap before training on a round whose verifiers are wrong too often,
    measured on labelled candidates of that round (`thresher audit check`)."""

    max_false_pass: float = Field(
        ge=0, le=1, description="most false-pass rate (passed among labelled incorrect)"
    )
    min_labels: int = Field(
        20, ge=1, description="a round with fewer labelled candidates stops (label it first)"
    )
    verifiers: list[str] = Field(
        default_factory=lambda: ["rule"],
        min_length=1,
        description="what is checked: rule (the selection rule) and/or verifier names",
    )
    sheet_size: int = Field(
        100, ge=1, description="candidates on the audit sheet written when the gate stops"
    )


def _share(description: str) -> Any:
    return Field(None, ge=0, le=1, description=description)


class MonitorsGateConfig(_Strict):
    """Stop a bootstrap before training on a round whose monitors (view round_monitors)
    show collapse or a gamed signal; every threshold is optional (unset: not checked)."""

    min_distinct_answers: float | None = Field(
        None, ge=0, description="least mean number of distinct final answers per prompt"
    )
    max_similarity: float | None = _share(
        "most mean pairwise MinHash similarity among a prompt's candidates"
    )
    max_repeated_opening_share: float | None = _share(
        "most share of prompts having a candidate open with the most repeated sentence"
    )
    max_repeated_closing_share: float | None = _share(
        "most share of prompts having a candidate close with the most repeated sentence"
    )
    max_length_drift: float | None = Field(
        None,
        ge=0,
        description="most distance from 1 of kept_length_ratio (median tokens of the kept "
        "candidates over that of all candidates)",
    )
    max_hinted_share: float | None = _share("most share of hinted candidates among the kept")
    min_headroom: float | None = Field(
        None,
        ge=0,
        le=1,
        description="least held-out pass@k - pass@1 (largest k) of the round's sampling model",
    )
    min_mixed_share: float | None = _share("least share of prompts solved sometimes, not always")


class BootstrapConfig(GatedStage):
    """Self-bootstrap rounds (STaR / RFT): round r samples the training prompts with
    model r, verifies, selects and trains model r+1, which is evaluated on held-out prompts."""

    base_model: str = Field(description="local model folder: model 0")
    max_rounds: int = Field(3, ge=1, description="rounds to run (each trains one model)")
    min_gain: float = Field(
        0.01, description="held-out pass@1 gain over the best earlier model that counts"
    )
    patience: int = Field(
        2, ge=1, description="stop after this many rounds in a row without min_gain"
    )
    prompts: PromptsConfig
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    difficulty: DifficultyConfig = Field(default_factory=DifficultyConfig)
    rationalize: RationalizeConfig = Field(default_factory=RationalizeConfig)
    train: BootstrapTrainConfig = Field(default_factory=BootstrapTrainConfig)
    eval: BootstrapEvalConfig
    audit: AuditGateConfig | None = Field(
        None, description="check each round's labelled false-pass rate before training on it"
    )
    monitors: MonitorsGateConfig | None = Field(
        None, description="check each round's monitors against thresholds before training on it"
    )
    rollback: RollbackConfig = Field(default_factory=RollbackConfig)

    @model_validator(mode="after")
    def _headroom_measured(self) -> BootstrapConfig:
        if self.monitors and self.monitors.min_headroom is not None and max(self.eval.ks) < 2:
            raise ValueError("monitors.min_headroom needs a pass@k with k > 1 in eval.ks")
        return self

    @model_validator(mode="after")
    def _held_out_truth(self) -> BootstrapConfig:
        self.eval_verify()  # refuses an evaluation without a reference before anything runs
        trained = (self.prompts.dataset, self.prompts.split)
        for check in self.eval.also:
            if (check.dataset, check.split) == trained:
                raise ValueError(
                    f"eval.also {check.label()} is what the rounds train on: a forgetting "
                    "check needs prompts held out from training"
                )
            if check.verify is not None:
                check.verify.with_reference()
        labels = [c.label() for c in self.eval.also]
        if len(set(labels)) != len(labels):
            raise ValueError(f"eval.also names a set twice: {labels}")
        return self

    def eval_verify(self) -> VerifyConfig:
        """The verifiers that decide held-out metrics: `eval.verify` as given (each of its
        lists must hold one that checks a reference), else training's that do."""
        if self.eval.verify is not None:
            self.eval.verify.with_reference()  # raises when a list has none
            return self.eval.verify
        return self.verify.with_reference()

    def curate_config(self, round_: int, model: str) -> CurateConfig:
        """Round `round_`'s curate step, sampling with `model`."""
        return CurateConfig(
            **self.runtime(),
            name=self.name,
            model=model,
            round=round_,
            prompts=self.prompts,
            gates=self.gates,
            verify=self.verify,
            select=self.select,
            difficulty=self.difficulty,
            rationalize=self.rationalize,
        )

    def train_config(self, round_: int) -> TrainConfig:
        """Round `round_`'s training step: its kept data (and earlier rounds') -> model r+1."""
        settings = self.train.model_dump(exclude={"all_rounds"})
        return TrainConfig(
            name=self.name,
            base_model=self.base_model,
            round=round_,
            lake=self.lake,
            data=TrainDataConfig(
                round=round_, all_rounds=self.train.all_rounds, pipeline=self.name
            ),
            **settings,
        )

    def eval_config(self, round_: int, model: str) -> EvalConfig:
        """Held-out evaluation of model `round_` (model 0 is the base model)."""
        held_out = self.eval
        overrides = {
            k: v
            for k, v in dict(
                temperature=held_out.temperature,
                top_p=held_out.top_p,
                max_tokens=held_out.max_tokens,
            ).items()
            if v is not None
        }
        return EvalConfig(
            **self.runtime()
            | {"sampling": self.sampling.model_copy(update={**overrides, "k": held_out.n})},
            name=self.name,
            model=model,
            round=round_,
            prompts=held_out.prompts,
            n=held_out.n,
            ks=held_out.ks,
            verify=self.eval_verify(),
        )

    def forgetting_eval_config(self, check: int, round_: int, model: str) -> EvalConfig:
        """Evaluation of model `round_` on forgetting check number `check` (eval.also)."""
        also = self.eval.also[check]
        main = self.eval_config(round_, model)
        return EvalConfig.model_validate(
            main.model_dump()
            | {
                "name": forgetting_name(self.name, also),
                "prompts": also.prompts().model_dump(),
                "verify": (also.verify or main.verify).model_dump(),
            }
        )


def forgetting_name(pipeline: str, check: ForgettingCheckConfig) -> str:
    """The name a forgetting check's evaluations are filed under (apart from the main one)."""
    return f"{pipeline}{FORGETTING}{check.label()}"


FORGETTING = "~"  # between a pipeline's name and a forgetting check's label


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate."""


def load_config(path: str | Path, kind: type[BaseModel] | None = None):
    """Read and validate a pipeline YAML config (curate by default)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    try:
        return (kind or CurateConfig)(**data)
    except ValidationError as e:
        lines = [f"{path}: invalid config"]
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None
