"""The `reward` verifier: a sequence-classification reward model scores each candidate."""

from __future__ import annotations

import gc
import json
import time
import traceback
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import Field

from thresher.intervals import wilson_interval
from thresher.stores.runs import latest_rm_check
from thresher.verifiers.base import GateRefused, Verdict, Verifier, verdict_frame

if TYPE_CHECKING:
    from thresher.config import GatesConfig
    from thresher.stores.lake import Lake

# Loaded (tokenizer, model) per folder. Scoring empties it when done (see release), so a
# model lives only while a batch is scored, inside the device slot that covers it.
_MODELS: dict[str, Any] = {}


def release(path: str | None = None) -> None:
    """Drop the cached reward model of `path` (default: all) and give its device memory back."""
    if path is None:
        _MODELS.clear()
    else:
        _MODELS.pop(path, None)
    gc.collect()  # a model's modules can sit in reference cycles
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def loaded() -> list[str]:
    """Folders whose reward model is loaded now."""
    return list(_MODELS)


def _load(path: str):
    if path not in _MODELS:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        cuda = torch.cuda.is_available()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=torch.bfloat16 if cuda else torch.float32
        )
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        model.to("cuda" if cuda else "cpu").eval()
        _MODELS[path] = (tokenizer, model)
    return _MODELS[path]


class RewardModel(Verifier):
    """Score (prompt, candidate) with a reward model; pass by threshold or top-n per prompt.

    Options: `model` (a local folder), `threshold` (pass when score >= it; default 0.0),
    `top_n` (instead: the n best candidates of each prompt pass), `batch_size`,
    `max_length`. Inputs are sorted by length so padding stays small. Each run loads the
    model and frees it (device memory included) before returning, so nothing stays on the
    device once the slot around it is released; run(batch, keep=True) keeps it loaded for
    the next call until release().
    """

    name = "reward"
    uses_device = True
    reads_tool_output = True  # it scores the whole candidate, the reasoning it ran included
    ranks = True
    operational = frozenset({"batch_size"})

    class Options(Verifier.Options):
        model: str = Field(description="a local reward model folder")
        threshold: float | None = Field(None, description="pass when score >= it (default 0.0)")
        top_n: int | None = Field(None, ge=1, description="instead: the n best of each prompt")
        batch_size: int = Field(16, ge=1, description="candidates scored at once")
        max_length: int = Field(2048, ge=1, description="tokens of prompt and candidate")

    @classmethod
    def gate(cls, lake: Lake, options: RewardModel.Options, gates: GatesConfig) -> dict[str, Any]:
        """Its model's pairwise accuracy as its latest `thresher rm-check` measured it;
        RewardModelRejected when it is missing or below gates.min_pairwise_accuracy and
        gates.force_reward_model is not set."""
        if not options.model:
            raise RewardModelRejected(
                "the reward verifier needs a model: set verify.options.reward.model"
            )
        key = model_key(options.model)
        check = latest_rm_check(lake, key)
        return reward_model_gate(key, check, gates.min_pairwise_accuracy, gates.force_reward_model)

    def __init__(
        self,
        model: str,
        threshold: float | None = None,
        top_n: int | None = None,
        batch_size: int = 16,
        max_length: int = 2048,
    ):
        if threshold is not None and top_n is not None:
            raise ValueError("give threshold or top_n, not both")
        self.model = model
        self.threshold = 0.0 if threshold is None and top_n is None else threshold
        self.top_n = top_n
        self.batch_size = batch_size
        self.max_length = max_length

    def _texts(self, tokenizer, rows: list[dict]) -> list[str]:
        out = []
        for row in rows:
            if row.get("messages") and tokenizer.chat_template:
                messages = json.loads(row["messages"])
                convo = [*messages, {"role": "assistant", "content": row["text"]}]
                out.append(tokenizer.apply_chat_template(convo, tokenize=False))
            else:
                out.append((row.get("prompt") or "") + row["text"])
        return out

    def scores(self, rows: list[dict], keep: bool = False) -> list[float]:
        """One reward per row, in row order; the model is freed afterwards unless `keep`."""
        try:
            return self._scores(rows)
        except BaseException as e:
            if not keep:  # a kept traceback (a retried task's) would keep the model alive
                traceback.clear_frames(e.__traceback__)
            raise
        finally:
            if not keep:
                release(self.model)

    def _scores(self, rows: list[dict]) -> list[float]:
        """scores() with the model loaded (its references end with this frame)."""
        import torch

        tokenizer, model = _load(self.model)
        texts = self._texts(tokenizer, rows)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        scores = [0.0] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                enc = tokenizer(
                    [texts[i] for i in idx],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                ).to(model.device)
                logits = model(**enc).logits.float()
                values = logits[:, 0] if logits.shape[1] == 1 else logits[:, -1] - logits[:, 0]
                for i, v in zip(idx, values.tolist(), strict=True):
                    scores[i] = v
        return scores

    def run(self, batch: pl.DataFrame, keep: bool = False) -> pl.DataFrame:
        """One verdict per candidate; frees the model when done unless `keep` (then call
        release() when the device is given back)."""
        rows = batch.to_dicts()
        start = time.perf_counter()
        scores = self.scores(rows, keep=keep)
        per_row_ms = (time.perf_counter() - start) * 1000 / max(len(rows), 1)
        if self.top_n is not None:
            ranked = pl.DataFrame({"p": [r["prompt_id"] for r in rows], "s": scores})
            rank = ranked.select(pl.col("s").rank("ordinal", descending=True).over("p"))["s"]
            passed = [r <= self.top_n for r in rank.to_list()]
            rule = f"top {self.top_n} of its prompt"
        else:
            passed = [s >= self.threshold for s in scores]
            rule = f">= {self.threshold}"
        verdicts = [
            Verdict(s, p, f"reward {s:.4f} {'meets' if p else 'misses'} {rule}")
            for s, p in zip(scores, passed, strict=True)
        ]
        return verdict_frame(
            self.name, batch["candidate_id"].to_list(), verdicts, [per_row_ms] * len(rows)
        )


def model_key(model: str) -> str:
    """How a reward model is recorded and looked up: a local folder as its absolute path,
    anything else as given."""
    from pathlib import Path

    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def pairwise_accuracy(
    model: str, pairs: list[dict], batch_size: int = 16, max_length: int = 2048
) -> dict[str, Any]:
    """The share of pairs whose chosen answer the reward model scores above the rejected one
    (a tie counts as wrong), with its 95 % Wilson interval.

    Each pair has `prompt` and/or `messages` (as the prompts table holds them), `chosen`
    and `rejected`; both answers are scored as the `reward` verifier scores a candidate.
    Returns pairs, correct, ties, accuracy, low, high."""
    if not pairs:
        raise ValueError("no preference pairs to score")
    rows = [
        {"prompt": p.get("prompt"), "messages": p.get("messages"), "text": p[side]}
        for p in pairs
        for side in ("chosen", "rejected")
    ]
    scores = RewardModel(model, batch_size=batch_size, max_length=max_length).scores(rows)
    chosen, rejected = scores[0::2], scores[1::2]
    correct = sum(c > r for c, r in zip(chosen, rejected, strict=True))
    ties = sum(c == r for c, r in zip(chosen, rejected, strict=True))
    low, high = wilson_interval(correct, len(pairs))
    return {
        "pairs": len(pairs),
        "correct": correct,
        "ties": ties,
        "accuracy": correct / len(pairs),
        "low": low,
        "high": high,
    }


class RewardModelRejected(GateRefused):
    """A reward model with no pairwise accuracy recorded, or one below the bar."""


def _figure(check: dict[str, Any]) -> str:
    return f"{check['accuracy']:.2f} [{check['low']:.2f}, {check['high']:.2f}]"


def reward_model_gate(
    model: str, check: dict[str, Any] | None, min_accuracy: float, force: bool
) -> dict[str, Any]:
    """Whether a pipeline may select with reward model `model`, given its latest check
    (accuracy, low, high, pairs, checked_at; None: never checked): the figure to record
    in the run's summary, or RewardModelRejected when it is missing or below
    `min_accuracy` and not forced."""
    if check is None:
        if force:
            return {"forced": True, "accuracy": None, "min_accuracy": min_accuracy}
        raise RewardModelRejected(
            f"no pairwise accuracy recorded for reward model {model}: run "
            f"`thresher rm-check --model {model} --from-lake` (or --pairs FILE) first, "
            "or set gates.force_reward_model: true"
        )
    figure = {k: check.get(k) for k in ("accuracy", "low", "high", "pairs", "checked_at")}
    figure["min_accuracy"] = min_accuracy
    if check["accuracy"] >= min_accuracy:
        return figure
    if force:
        return {"forced": True, **figure}
    raise RewardModelRejected(
        f"reward model {model} has pairwise accuracy {_figure(check)} on {check['pairs']} "
        f"pairs (< {min_accuracy}, thresher rm-check at {check['checked_at']}); a reward "
        "model this often wrong about which answer is better keeps wrong answers: check a "
        "better one, or set gates.force_reward_model: true to use it anyway"
    )
