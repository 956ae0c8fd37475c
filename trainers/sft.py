"""Supervised fine-tuning on selected data: LoRA on every linear layer, or full fine-tuning.

A plain torch loop (so resuming is exact): seeded data order per epoch, gradient
accumulation, warmup + cosine schedule, evaluation loss on a held-out slice, a
checkpoint every N optimizer steps (the last few kept, each written whole then renamed),
and resume from the newest checkpoint. The result is a merged model folder that vLLM
loads and/or the LoRA adapter folder.

The same loop runs in each process under torchrun (DDP, or FSDP for models that do not
fit one GPU): see trainers.distributed for how batches are split and losses averaged,
and trainers.launch for how a flow starts it. Checkpoints hold unsharded state in the
same layout whatever the process count, so a run can resume with a different one.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thresher.config import TrainSettings
from thresher.trainers.data import IGNORE, batch_shape, build_examples, collate, collate_packed
from thresher.trainers.distributed import Dist

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

ONE = Dist()  # a single process


def learning_rate(settings: TrainSettings) -> float:
    """The configured learning rate, else 2e-4 for LoRA and 2e-5 for full fine-tuning."""
    if settings.learning_rate is not None:
        return settings.learning_rate
    return 2e-4 if settings.method == "lora" else 2e-5


@dataclass
class TrainResult:
    steps: int
    final_loss: float | None
    eval_loss: float | None
    tokens: int
    tokens_per_s: float
    model_dir: Path | None
    adapter_dir: Path | None
    examples: int
    skipped: dict[str, int]
    resumed_from: int
    eval_examples: int = 0  # held out for eval_loss
    eval_skipped: str | None = None  # why eval_fraction > 0 gave no eval split
    fallback_examples: int = 0  # examples trained on the raw answer text (see trainers.data)
    best_step: int | None = None  # early stopping: the step whose weights were kept
    best_eval_loss: float | None = None
    stopped_early: bool = False  # early stopping ended it before its steps
    # the micro-batches as run (packed when settings.packing) and as they would be one
    # example a row: rows, token slots (padding included) and the padding's share of them
    rows: int = 0
    row_tokens: int = 0
    padding_share: float = 0.0
    unpacked_rows: int = 0
    unpacked_row_tokens: int = 0
    unpacked_padding_share: float = 0.0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def claim_output(out_dir: str | Path, run_key: str) -> bool:
    """Make `out_dir` the output of run `run_key`: checkpoints another run left there are
    removed, so a run resumes only its own. True when some were removed."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "run.txt"
    stale = marker.exists() and marker.read_text().strip() != run_key
    if stale:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        shutil.rmtree(out / "best", ignore_errors=True)
    marker.write_text(run_key + "\n")
    return stale


def _checkpoints(out: Path) -> list[Path]:
    folder = out / "checkpoints"
    if not folder.exists():
        return []
    found = [
        p for p in folder.iterdir() if p.name.startswith("step-") and (p / "state.json").exists()
    ]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_model(
    base_model: str, settings: TrainSettings, device: str | None = None
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model to train: base weights, fp32 on CPU, bf16 + gradient checkpointing on GPU,
    wrapped with LoRA when asked; on `device` (default: the GPU when there is one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        base_model, dtype=torch.bfloat16 if cuda else torch.float32
    )
    if cuda:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
        if device != "cpu":
            model.to(device or "cuda")
    if settings.method == "lora":
        from peft import LoraConfig, get_peft_model

        if cuda:
            model.enable_input_require_grads()
        config = LoraConfig(
            r=settings.lora.r,
            lora_alpha=settings.lora.alpha,
            lora_dropout=settings.lora.dropout,
            target_modules=settings.lora.target_modules,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
    return model, tokenizer


MIN_EVAL_EXAMPLES = 20  # below this a held-out slice is noise and costs training data


def eval_split_size(n_examples: int, eval_fraction: float) -> tuple[int, str | None]:
    """(examples held out for evaluation, why none are when eval_fraction asked for some)."""
    if eval_fraction <= 0:
        return 0, None
    if n_examples < MIN_EVAL_EXAMPLES:
        return 0, (
            f"eval_fraction {eval_fraction} needs at least {MIN_EVAL_EXAMPLES} examples; "
            f"got {n_examples}"
        )
    n_eval = int(n_examples * eval_fraction)
    if n_eval == 0:
        return 0, f"eval_fraction {eval_fraction} of {n_examples} examples is under 1 example"
    return n_eval, None


def _batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = list(range(n))
    random.Random(seed * 1000003 + epoch).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def train(
    settings: TrainSettings,
    base_model: str,
    rows: list[dict[str, Any]],
    out_dir: str | Path,
    on_metrics: Callable[[list[dict]], None] | None = None,
    progress: bool = True,
    dist: Dist = ONE,
) -> TrainResult:
    """Fine-tune `base_model` on SFT rows (messages, or prompt + completion) as `settings`
    says; resumes from out_dir.

    Under torchrun, `dist` is this process's place (trainers.distributed.init_distributed):
    only rank 0 reports metrics, shows progress and writes files."""
    import torch
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    model, tokenizer = load_model(base_model, settings, dist.load_device)

    examples, report = build_examples(rows, tokenizer, settings.max_len)
    if report.skipped and dist.main:
        _log(f"skipped {sum(report.skipped.values())} rows: {dict(report.skipped)}")
    if not examples:
        raise ValueError("no trainable rows: every row was skipped (see the counts above)")
    n_eval, eval_skipped = eval_split_size(len(examples), settings.eval_fraction)
    if dist.main and report.fallback_examples:
        _log(f"warning: {report.fallback_note()}")
    if dist.main and eval_skipped:
        _log(f"warning: no eval split: {eval_skipped}")
    shuffled = list(range(len(examples)))
    random.Random(settings.seed).shuffle(shuffled)
    eval_set = [examples[i] for i in shuffled[:n_eval]]
    train_set = [examples[i] for i in shuffled[n_eval:]]

    per_epoch = math.ceil(math.ceil(len(train_set) / settings.batch_size) / settings.grad_accum)
    total = settings.max_steps or max(1, math.ceil(per_epoch * settings.epochs))
    ckpts = _checkpoints(out)
    if ckpts:  # weights go in before FSDP shards them
        _load_weights(_read_weights(ckpts[-1]), model, settings)
    model = dist.wrap(model)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=learning_rate(settings), weight_decay=settings.weight_decay)
    sched = get_cosine_schedule_with_warmup(opt, int(total * settings.warmup_ratio), total)

    step, resumed_from = 0, 0
    if ckpts:
        step = resumed_from = _load_training_state(ckpts[-1], opt, sched, dist)
        if dist.main:
            _log(f"resuming from {ckpts[-1]} (step {step} of {total})")

    pad = tokenizer.pad_token_id
    tokens_done, last_loss, last_eval = 0, None, None
    shape = dict.fromkeys(("rows", "row_tokens", "unpacked_rows", "unpacked_row_tokens"), 0)
    watch = settings.early_stopping if eval_set else None
    best = _read_best(out) if watch and ckpts else {"step": None, "loss": None, "stale": 0}
    start = time.perf_counter()
    # a log file (not a terminal) gets a line every 10 s instead of one per step
    every = 0.1 if sys.stderr.isatty() else 10.0
    bar = tqdm(
        total=total,
        initial=step,
        unit="step",
        desc="train",
        disable=not progress or not dist.main,
        mininterval=every,
    )
    model.train()
    while step < total and not (watch and best["stale"] >= watch.patience):
        epoch = step // per_epoch
        micro = _batches(len(train_set), settings.batch_size, settings.seed, epoch)
        first = (step % per_epoch) * settings.grad_accum  # micro-batches this epoch already done
        for i in range(first, len(micro), settings.grad_accum):
            group = micro[i : i + settings.grad_accum]
            loss_sum = dist.sum(
                _backward(model, train_set, group, pad, device, dist, settings.packing)
            )[0]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            tokens_done += sum(len(train_set[j]["input_ids"]) for g in group for j in g)
            _count_shape(shape, train_set, group, settings.packing, dist.world)
            last_loss = loss_sum
            elapsed = time.perf_counter() - start
            row = {
                "step": step,
                "epoch": step / per_epoch,
                "loss": loss_sum,
                "lr": sched.get_last_lr()[0],
                "tokens": tokens_done,
                "tokens_per_s": tokens_done / elapsed if elapsed else 0.0,
                "eval_loss": None,
            }
            if eval_set and (step % settings.eval_every == 0 or step == total):
                row["eval_loss"] = last_eval = evaluate(
                    dist.unwrap(model), eval_set, pad, settings.batch_size, dist
                )
            stop = False
            if watch is not None and row["eval_loss"] is not None:
                if best["loss"] is None or row["eval_loss"] < best["loss"] - watch.min_delta:
                    best = {"step": step, "loss": row["eval_loss"], "stale": 0}
                    _save_best(out, best, model, settings, dist)
                else:
                    best["stale"] += 1
                    _save_best(out, best, None, settings, dist)
                stop = best["stale"] >= watch.patience
            logged = step % settings.log_every == 0 or step == total or row["eval_loss"]
            if on_metrics and dist.main and logged:
                on_metrics([row])
            bar.set_postfix(
                loss=f"{loss_sum:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False
            )
            bar.update(1)
            if step % settings.save_every == 0 or step == total or stop:
                _save_checkpoint(out, step, model, opt, sched, settings, dist)
            if step >= total or stop:
                break
    bar.close()
    stopped_early = step < total
    if stopped_early and dist.main:
        _log(
            f"early stopping at step {step}: eval loss has not improved on step "
            f"{best['step']}'s {best['loss']:.4f} for {best['stale']} evaluations"
        )
    elapsed = time.perf_counter() - start
    kept = _read_weights(out / "best") if watch and best["step"] not in (None, step) else None
    model_dir, adapter_dir = _export(model, tokenizer, out, settings, base_model, dist, kept)
    result = TrainResult(
        steps=step,
        final_loss=last_loss,
        eval_loss=last_eval,
        tokens=tokens_done,
        tokens_per_s=tokens_done / elapsed if elapsed else 0.0,
        model_dir=model_dir,
        adapter_dir=adapter_dir,
        examples=len(examples),
        skipped=dict(report.skipped),
        resumed_from=resumed_from,
        eval_examples=n_eval,
        eval_skipped=eval_skipped,
        fallback_examples=report.fallback_examples,
        best_step=best["step"] if watch else None,
        best_eval_loss=best["loss"] if watch else None,
        stopped_early=stopped_early,
        rows=shape["rows"],
        row_tokens=shape["row_tokens"],
        padding_share=1 - tokens_done / shape["row_tokens"] if shape["row_tokens"] else 0.0,
        unpacked_rows=shape["unpacked_rows"],
        unpacked_row_tokens=shape["unpacked_row_tokens"],
        unpacked_padding_share=(
            1 - tokens_done / shape["unpacked_row_tokens"] if shape["unpacked_row_tokens"] else 0.0
        ),
    )
    if dist.main:
        _write_lineage(out, settings, base_model, result, dist)
    return result


def _write_lineage(
    out: Path, settings: TrainSettings, base_model: str, result: TrainResult, dist: Dist
) -> None:
    lineage = {
        "spec": {"base_model": base_model, **settings.model_dump()},
        "result": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()},
    }
    if dist.world > 1:
        lineage["distributed"] = {"processes": dist.world, "strategy": dist.strategy}
    (out / "thresher_train.json").write_text(json.dumps(lineage, indent=2, default=str))


def _count_shape(
    shape: dict[str, int], train_set: list[dict], group: list[list[int]], packing: bool, world: int
) -> None:
    """Add one step's rows and token slots, as run and one example a row, to `shape`."""
    for g in group:
        for rank in range(world):
            lengths = [len(train_set[j]["input_ids"]) for j in g[rank::world]]
            if not lengths:
                continue
            rows, width = batch_shape(lengths, packing)
            shape["rows"] += rows
            shape["row_tokens"] += rows * width
            rows, width = batch_shape(lengths, False)
            shape["unpacked_rows"] += rows
            shape["unpacked_row_tokens"] += rows * width


def _backward(
    model,
    train_set: list[dict],
    group: list[list[int]],
    pad: int,
    device,
    dist: Dist = ONE,
    packing: bool = False,
) -> float:
    """Forward and backward over one optimizer step's micro-batches (this rank's slice of
    each, packed when `packing`); returns this rank's part of the step's loss (a mean over
    the step's answer tokens, so the parts of all ranks add up to it)."""
    n_tokens = sum(sum(1 for t in train_set[j]["labels"] if t != IGNORE) for g in group for j in g)
    loss_sum = 0.0
    for m, g in enumerate(group):
        rows, weight = dist.shard(g)
        examples = [train_set[j] for j in rows]
        batch = collate_packed(examples, pad) if packing else collate(examples, pad)
        batch = {k: v.to(device) for k, v in batch.items()}
        if packing:
            # with a KV cache transformers ignores the packing in position_ids (masking_utils)
            batch["use_cache"] = False
        # weight each micro-batch by its answer tokens: a token-level mean overall
        n = int((batch["labels"] != IGNORE).sum())
        with dist.grad_sync(model, sync=m == len(group) - 1):
            # one process: logits only where an answer token is predicted (the same loss);
            # a DDP/FSDP wrapper must see its own forward, so those keep the model's
            mean = answer_loss(model, batch) if dist.world == 1 else model(**batch).loss
            loss = mean * (weight * n / max(n_tokens, 1))
            # DDP and FSDP average the ranks' gradients: scale back up to their sum
            (loss * dist.world).backward()
        loss_sum += float(loss.detach())
    return loss_sum


def answer_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The causal LM loss of `batch` (mean over its labelled tokens, as `model(**batch).loss`)
    with the output layer run only where a label is predicted.

    The prompt's positions need no logits: on a 49k vocabulary the output layer and its
    softmax are a fifth of a small model's forward work, and most of its memory traffic."""
    import torch

    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = causal.get_decoder(), causal.get_output_embeddings()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = decoder(**inputs).last_hidden_state
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE
    if not keep.any():  # nothing to predict: a zero that keeps the graph
        return hidden.sum() * 0.0
    logits = head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def evaluate(
    model: torch.nn.Module, eval_set: list[dict], pad: int, batch_size: int, dist: Dist = ONE
) -> float:
    """Token-level mean loss on the held-out slice (each rank scores its slice of a batch)."""
    import torch

    model.eval()
    total, count = 0.0, 0.0
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(eval_set), batch_size):
            rows, weight = dist.shard(list(range(i, min(i + batch_size, len(eval_set)))))
            batch = {k: v.to(device) for k, v in collate([eval_set[j] for j in rows], pad).items()}
            n = int((batch["labels"][:, 1:] != IGNORE).sum()) * weight
            total += float(model(**batch).loss) * n
            count += n
    total, count = dist.sum(total, count)
    model.train()
    return total / max(count, 1)


def _trainable_state(model, settings: TrainSettings, dist: Dist = ONE) -> dict:
    """What a checkpoint keeps: the LoRA weights, or every weight (unsharded, on rank 0)."""
    model = dist.unwrap(model)
    if dist.fsdp:
        return _gathered_state(model, settings, dist)
    if settings.method == "lora":
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model)
    return model.state_dict()


def _gathered_state(model, settings: TrainSettings, dist: Dist) -> dict:
    """_trainable_state of an FSDP-sharded model: gathered, complete on rank 0 only."""
    lora = settings.method == "lora"
    names = {n for n, p in model.named_parameters() if p.requires_grad} if lora else None
    state = dist.full_state(model, names)
    if lora and dist.main:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model, state_dict=state)
    return state


def _save_checkpoint(
    out: Path, step: int, model, opt, sched, settings: TrainSettings, dist: Dist = ONE
) -> None:
    """Every process gathers its part; rank 0 writes the folder whole, then renames it."""
    weights = _trainable_state(model, settings, dist)
    optim = dist.optim_state(opt)
    if dist.main:
        _write_checkpoint(out, step, weights, optim, sched, settings)
    dist.barrier()


def _write_checkpoint(out: Path, step: int, weights: dict, optim: dict, sched, settings) -> None:
    import torch

    folder = out / "checkpoints"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(weights, tmp / "weights.pt")
    torch.save({"optimizer": optim, "scheduler": sched.state_dict()}, tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "time": time.time()}))
    final = folder / f"step-{step}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in _checkpoints(out)[: -settings.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)


def _save_best(out: Path, best: dict, model, settings: TrainSettings, dist: Dist) -> None:
    """Record the best eval loss so far (a resumed run goes on counting from it) and, with
    `model`, its weights (<out>/best/)."""
    weights = _trainable_state(model, settings, dist) if model is not None else None
    if dist.main:
        folder = out / "best"
        folder.mkdir(exist_ok=True)
        if weights is not None:
            import torch

            torch.save(weights, folder / ".weights.pt.tmp")
            os.replace(folder / ".weights.pt.tmp", folder / "weights.pt")
        (folder / "best.json").write_text(json.dumps(best))
    dist.barrier()


def _read_best(out: Path) -> dict:
    path = out / "best" / "best.json"
    if not path.exists():
        return {"step": None, "loss": None, "stale": 0}
    return json.loads(path.read_text())


def _read_weights(path: Path) -> dict:
    import torch

    return torch.load(path / "weights.pt", map_location="cpu")


def _load_weights(weights: dict, model, settings: TrainSettings) -> None:
    """Put a checkpoint's (unsharded) weights into an unwrapped model."""
    if settings.method == "lora":
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
    else:
        model.load_state_dict(weights)


def _load_training_state(path: Path, opt, sched, dist: Dist = ONE) -> int:
    """Optimizer and schedule of a checkpoint (sharded like the parameters); its step."""
    import torch

    state = torch.load(path / "optim.pt", map_location="cpu")
    dist.load_optim_state(opt, state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return json.loads((path / "state.json").read_text())["step"]


def _export_paths(out: Path, settings: TrainSettings) -> tuple[Path | None, Path | None]:
    """(merged model folder, adapter folder) the settings' output writes, None when not."""
    adapter = settings.method == "lora" and settings.output in ("adapter", "both")
    merged = settings.output in ("merged", "both") or settings.method == "full"
    return (out / "model" if merged else None), (out / "adapter" if adapter else None)


def _export(
    model,
    tokenizer,
    out: Path,
    settings: TrainSettings,
    base_model: str,
    dist: Dist = ONE,
    weights: dict | None = None,
) -> tuple[Path | None, Path | None]:
    """Write the adapter and/or the merged model (what vLLM loads) next to the checkpoints:
    the model as trained, or with `weights` (an earlier step's, kept by early stopping).

    Rank 0 writes; an FSDP-sharded model is first gathered into a fresh copy on its CPU."""
    if dist.fsdp:
        state = weights if weights is not None else _trainable_state(model, settings, dist)
        if dist.main:
            model, _ = load_model(base_model, settings, "cpu")
            _load_weights(state, model, settings)
    elif weights is not None:
        _load_weights(weights, dist.unwrap(model), settings)
    if dist.main:
        _write_export(dist.unwrap(model), tokenizer, out, settings)
    dist.barrier()
    return _export_paths(out, settings)


def _write_export(model, tokenizer, out: Path, settings: TrainSettings) -> None:
    import torch

    model_dir, adapter_dir = _export_paths(out, settings)
    if adapter_dir:
        model.save_pretrained(adapter_dir)
        tokenizer.save_pretrained(adapter_dir)
    if model_dir:
        merged = model.merge_and_unload() if settings.method == "lora" else model
        merged = merged.to(torch.float32) if not torch.cuda.is_available() else merged
        tmp = out / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(model_dir, ignore_errors=True)
        os.replace(tmp, model_dir)
