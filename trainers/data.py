"""SFT examples: chat template applied, loss only on the answer tokens."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

IGNORE = -100


@dataclass
class BuildReport:
    """What building examples did: rows in, examples out, and why rows were skipped."""

    rows: int = 0
    examples: int = 0
    truncated: int = 0
    skipped: Counter = field(default_factory=Counter)
    fallback_examples: int = 0  # examples whose answer is the raw text (see encode)

    def fallback_note(self) -> str | None:
        """One line saying how many examples train on the raw answer text and why, or None."""
        if not self.fallback_examples:
            return None
        return (
            f"{self.fallback_examples} of {self.examples} examples train on the raw answer "
            "text plus EOS, not the chat template's rendering of it: the template rewrites "
            "earlier turns once the answer is added, so the rendered prompt is not a prefix "
            "of the rendered conversation"
        )


def _split_row(row: dict[str, Any]) -> tuple[list[dict] | None, str | None, str]:
    """(prompt messages or None, plain prompt or None, answer) of one SFT row."""
    messages = row.get("messages")
    if isinstance(messages, str):
        messages = json.loads(messages)
    if messages:
        if messages[-1].get("role") != "assistant":
            raise ValueError("the last message must be the assistant's answer")
        return messages[:-1], None, messages[-1]["content"]
    if row.get("prompt") is None or row.get("completion") is None:
        raise ValueError("a row needs messages, or prompt and completion")
    return None, row["prompt"], row["completion"]


def encode(row: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) exactly as sampling sees them, the answer ending in EOS."""
    prompt_ids, answer_ids, _, _ = encode_checked(row, tokenizer)
    return prompt_ids, answer_ids


def encode_checked(
    row: dict[str, Any], tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], list[int], bool, list[int] | None]:
    """encode(), whether the answer fell back to its raw text, and the answer's labels where
    they differ from its ids (-100 on a code tool's output; None: every answer token).

    The answer is the rendered conversation minus the rendered prompt. A template that
    renders earlier turns differently once the answer is added (one that strips earlier
    reasoning, say) leaves no such suffix: the raw answer text is used instead."""
    prompt_msgs, prompt, answer = _split_row(row)
    fell_back = False
    if prompt_msgs is not None:
        prompt_text = tokenizer.apply_chat_template(
            prompt_msgs, tokenize=False, add_generation_prompt=True
        )
        full_text = tokenizer.apply_chat_template(
            [*prompt_msgs, {"role": "assistant", "content": answer}], tokenize=False
        )
        fell_back = not full_text.startswith(prompt_text)
        answer_text = answer if fell_back else full_text[len(prompt_text) :]
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    else:
        answer_text = answer
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    answer_ids, labels = _answer_tokens(row, tokenizer, answer, answer_text)
    eos = tokenizer.eos_token_id
    if eos is not None and (not answer_ids or answer_ids[-1] != eos):
        answer_ids, labels = [*answer_ids, eos], [*labels, eos]
    row_labels = labels if labels != answer_ids else None
    return prompt_ids, answer_ids, fell_back, row_labels


def _answer_tokens(
    row: dict[str, Any], tokenizer: PreTrainedTokenizerBase, answer: str, answer_text: str
) -> tuple[list[int], list[int]]:
    """The answer's ids and labels: -100 on every token that holds a character a code tool
    wrote (the row's `tool_spans` of its completion): context, never a target."""
    spans = row.get("tool_spans")
    if not spans:
        ids = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
        return ids, list(ids)
    at = answer_text.find(answer)
    if at < 0:
        raise ValueError("tool output not maskable: the answer is not in its rendering")
    try:
        enc = tokenizer(answer_text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        raise ValueError("tool output not maskable: needs a fast tokenizer (offsets)") from None
    tool = [(at + a, at + b) for a, b in spans]
    ids = enc["input_ids"]
    labels = [
        IGNORE if any(start < b and end > a for a, b in tool) else t
        for t, (start, end) in zip(ids, enc["offset_mapping"], strict=True)
    ]
    return ids, labels


def build_examples(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_len: int
) -> tuple[list[dict[str, list[int]]], BuildReport]:
    """input_ids and labels (-100 on prompt tokens and on a code tool's output) for each row
    that keeps an answer.

    Longer rows keep their whole prompt and lose the end of the answer; a row whose
    prompt alone fills `max_len` is skipped and counted, never trained on. Examples whose
    answer fell back to its raw text are counted in the report's `fallback_examples`.
    """
    report = BuildReport(rows=len(rows))
    out = []
    for row in rows:
        try:
            prompt_ids, answer_ids, fell_back, labels = encode_checked(row, tokenizer)
        except (ValueError, KeyError, TypeError) as e:
            report.skipped[f"malformed: {e}"] += 1
            continue
        if not answer_ids:
            report.skipped["empty answer"] += 1
            continue
        labels = answer_ids if labels is None else labels
        if len(prompt_ids) >= max_len:
            report.skipped["prompt fills max_len"] += 1
            continue
        room = max_len - len(prompt_ids)
        if len(answer_ids) > room:
            answer_ids, labels = answer_ids[:room], labels[:room]
            report.truncated += 1
        report.fallback_examples += fell_back
        out.append(
            {
                "input_ids": prompt_ids + answer_ids,
                "labels": [IGNORE] * len(prompt_ids) + labels,
            }
        )
    report.examples = len(out)
    return out, report


def collate(batch: list[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask, labels (-100 on padding)."""
    import torch

    width = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[i, :n] = torch.tensor(b["input_ids"])
        labels[i, :n] = torch.tensor(b["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` in bins of at most `capacity` tokens (best-fit decreasing).

    Longest first, each into the fullest bin it still fits (ties: the earlier bin); an
    item longer than `capacity` gets a bin of its own. The same lengths give the same bins."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        fits = [b for b in range(len(bins)) if room[b] >= n]
        if fits:
            b = min(fits, key=lambda b: (room[b], b))
            bins[b].append(i)
            room[b] -= n
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def batch_shape(lengths: list[int], packed: bool) -> tuple[int, int]:
    """(rows, row width) of a micro-batch: packed as collate_packed packs it, or one example
    a row."""
    if not packed:
        return len(lengths), max(lengths)
    bins = pack(lengths, max(lengths))
    return len(bins), max(sum(lengths[i] for i in b) for b in bins)


def collate_packed(
    batch: list[dict[str, list[int]]], pad_id: int, capacity: int | None = None
) -> dict[str, torch.Tensor]:
    """Packed tensors: input_ids, position_ids, labels; no attention_mask.

    Each row holds several examples (see pack) in at most `capacity` tokens, by default the
    longest example's length: rows no wider than unpadded ones, so packing never adds
    attention work per row (the mask is dense on CPU) and only removes padding. Rows are
    right-padded to the longest row. Positions
    restart at 0 for every example, so transformers builds a block-diagonal causal mask
    from them (masking_utils.find_packed_sequence_indices): no token attends across
    examples. Each example's first label is -100: unpacked, nothing predicts an example's
    first token, and packed it must not be predicted from the previous example."""
    import torch

    lengths = [len(b["input_ids"]) for b in batch]
    bins = pack(lengths, capacity or max(lengths))
    width = max(sum(lengths[i] for i in b) for b in bins)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    labels = torch.full((len(bins), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(bins), width), dtype=torch.long)
    for r, b in enumerate(bins):
        at = 0
        for i in b:
            n = lengths[i]
            ids[r, at : at + n] = torch.tensor(batch[i]["input_ids"])
            labels[r, at + 1 : at + n] = torch.tensor(batch[i]["labels"][1:])
            positions[r, at : at + n] = torch.arange(n)
            at += n
        # the padding is a sequence of its own: it sees none of the examples
        positions[r, at:] = torch.arange(width - at)
    return {"input_ids": ids, "position_ids": positions, "labels": labels}
