"""The train section: what a model is fine-tuned on and how (SFT, LoRA or full)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from thresher.config.base import StageConfig, _Strict, counted_with, never, skipped_by


class TrainDataConfig(_Strict):
    """What to train on: a round's kept data in the lake, or a dataset on disk."""

    counted_at_default = frozenset({"round", "all_rounds", "pipeline", "path"})

    round: int | None = Field(0, ge=0, description="kept candidates of this round")
    all_rounds: bool = Field(True, description="rounds 0..round together (STaR default)")
    pipeline: str | None = Field(None, description="only data this curate pipeline (name) kept")
    path: str | None = Field(
        None, description="instead: a datasets folder or JSONL (messages or prompt+completion)"
    )
    restate_format: str | None = Field(
        None,
        pattern=r"^[A-Za-z][\w-]*$",
        description="a tag (e.g. answer): a kept answer whose prompt asks for <tag> but "
        "which states no <tag>...</tag> gets its final answer (as its verifier read it) "
        "restated in that format on a last line, and is marked `restated`",
    )


class LoraConfig(_Strict):
    counted_at_default = frozenset({"r", "alpha", "dropout", "target_modules"})

    r: int = Field(64, ge=1)
    alpha: int = Field(128, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class DistributedConfig(_Strict):
    """Training in several processes on this machine (one per GPU) under torchrun."""

    counted_at_default = frozenset({"processes", "strategy", "backend"})

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

    counted_at_default = frozenset({"patience", "min_delta"})

    patience: int = Field(3, ge=1, description="evaluations in a row without improvement")
    min_delta: float = Field(0.0, ge=0, description="an improvement smaller than this is none")


# -- training mixtures (train.mix) --------------------------------------------------

SELF = "self"  # a mix source `pipeline: self`: the rows this config trains on without a mix


class MixSource(_Strict):
    """One source of a training mixture: exactly one of `pipeline`, `dataset` or `path`,
    and its weight (its share of the mixed rows is weight / the sum of the weights)."""

    counted_at_default = frozenset(
        {"pipeline", "rounds", "dataset", "response", "path", "ingest_as", "weight", "on_short"}
    )

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

    counted_at_default = frozenset(
        {
            "init",
            "method",
            "lora",
            "learning_rate",
            "epochs",
            "max_steps",
            "batch_size",
            "grad_accum",
            "warmup_ratio",
            "weight_decay",
            "max_len",
            "eval_fraction",
            "eval_every",
            "save_every",
            "keep_checkpoints",
            "log_every",
            "seed",
            "output",
            "distributed",
            "early_stopping",
        }
    )

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
    # the global batch is batch_size whatever the process count: a training run may resume
    # with another (a bootstrap's identity has counted it from the start)
    distributed: DistributedConfig = skipped_by("train", default_factory=DistributedConfig)
    early_stopping: EarlyStoppingConfig | None = Field(
        None,
        description="stop on eval loss (every eval_every steps; needs eval_fraction > 0) "
        "and keep the best step's weights",
    )

    packing: bool = never(
        default=True,
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
    mix_rows: int | None = counted_with(
        "mix",
        default=None,
        ge=1,
        description="rows of the mixture; default: all of `self`'s rows (used once) over its "
        "share, else as many as no source needs repeating for",
    )

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

    counted_at_default = frozenset({"base_model", "round", "data", "out"})

    base_model: str = Field(description="local model folder")
    round: int = Field(0, ge=0, description="the round whose data trains model round+1")
    data: TrainDataConfig = Field(default_factory=TrainDataConfig)
    out: str | None = Field(
        None,
        description="default: <lake>/models/<name>/round-<round+1> "
        "(./models/... for a remote lake)",
    )
