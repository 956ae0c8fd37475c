"""Training on tool-calling candidates: -100 exactly on the prompt and the tool's output,
packed and unpacked, and the loss is the model's own tokens' loss."""

import json

import pytest

from thresher.samplers.vllm_offline import Completion
from thresher.segments import tool_spans
from thresher.trainers.data import IGNORE, build_examples, collate, collate_packed

PROMPTS = [
    "Ava buys 23 packs of 47 coins. How many coins does Ava buy?",
    "Ben had 90 cards and lost 17 of them. How many cards does Ben have left?",
]


def candidate(a: str, op: str, b: str, value: int, then: str) -> Completion:
    segments = [
        {"kind": "text", "text": " "},
        {"kind": "code", "text": f"```python\nprint({a} {op} {b})\n```"},
        {"kind": "output", "text": f"\n```output\n{value}\n```\n"},
        {"kind": "text", "text": then},
    ]
    return Completion("".join(s["text"] for s in segments), 9, "stop", tuple(segments))


CANDIDATES = [
    candidate("23", "*", "47", 1081, "The answer is 1081."),
    candidate("90", "-", "17", 73, "The answer is 73."),
]


@pytest.fixture(scope="module")
def tokenizer(tool_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model)


def rows():
    return [
        {
            "messages": [
                {"role": "user", "content": p},
                {"role": "assistant", "content": c.text},
            ],
            "tool_spans": tool_spans(c.text, json.dumps(list(c.segments))),
        }
        for p, c in zip(PROMPTS, CANDIDATES, strict=True)
    ]


def hand_built(tokenizer, prompt: str, c: Completion) -> tuple[list[int], list[int]]:
    """Ids and labels token by token: the model's runs of text and code and each output
    tokenized on their own, -100 on the prompt and on the outputs."""
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    labels = [IGNORE] * len(ids)
    runs: list[tuple[bool, str]] = []  # (the tool's?, text)
    for s in c.segments:
        tool = s["kind"] == "output"
        if runs and not tool and not runs[-1][0]:  # the model's text and code: one run
            runs[-1] = (False, runs[-1][1] + s["text"])
        else:
            runs.append((tool, s["text"]))
    for tool, text in runs:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += [IGNORE] * len(piece) if tool else piece
    return ids + [tokenizer.eos_token_id], labels + [tokenizer.eos_token_id]


def test_the_mask_is_minus_100_exactly_on_prompt_and_tool_output(tokenizer):
    examples, report = build_examples(rows(), tokenizer, max_len=256)
    assert report.examples == 2 and not report.skipped
    for ex, prompt, c in zip(examples, PROMPTS, CANDIDATES, strict=True):
        ids, labels = hand_built(tokenizer, prompt, c)
        assert ex["input_ids"] == ids  # the segments' boundaries are token boundaries here
        assert ex["labels"] == labels
        output = next(s["text"] for s in c.segments if s["kind"] == "output")
        masked = [t for t, lab in zip(ids, labels, strict=True) if lab == IGNORE]
        assert tokenizer.decode(masked).endswith(output)  # the output's every token
    # without the spans every answer token is a target: the mask is the spans' doing
    plain, _ = build_examples([{k: v for k, v in r.items() if k != "tool_spans"} for r in rows()],
                              tokenizer, max_len=256)  # fmt: skip
    assert sum(lab != IGNORE for lab in plain[0]["labels"]) > sum(
        lab != IGNORE for lab in examples[0]["labels"]
    )


def test_packing_keeps_the_mask(tokenizer):
    examples, _ = build_examples(rows(), tokenizer, max_len=256)
    unpacked = collate(examples, tokenizer.pad_token_id)
    for i, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert unpacked["labels"][i, :n].tolist() == ex["labels"]
    packed = collate_packed(examples, tokenizer.pad_token_id, capacity=512)
    assert packed["labels"].shape[0] == 1  # both in one row
    row, at = packed["labels"][0].tolist(), 0
    # pack() puts the longer first; each example's first label is -100 (nothing before it)
    for ex in sorted(examples, key=lambda e: -len(e["input_ids"])):
        n = len(ex["input_ids"])
        assert row[at : at + n] == [IGNORE, *ex["labels"][1:]]
        at += n


def test_the_loss_is_the_models_own_tokens_loss(tool_model, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from thresher.trainers.sft import answer_loss

    model = AutoModelForCausalLM.from_pretrained(tool_model).eval()
    examples, _ = build_examples(rows(), tokenizer, max_len=256)
    with torch.no_grad():
        for ex, prompt, c in zip(examples, PROMPTS, CANDIDATES, strict=True):
            batch = collate([ex], tokenizer.pad_token_id)
            trained = float(answer_loss(model, batch))
            # by hand: the unmasked model's logits, cross-entropy over the model's tokens
            ids, labels = hand_built(tokenizer, prompt, c)
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            own = [i for i in range(len(ids) - 1) if labels[i + 1] != IGNORE]
            nll = torch.nn.functional.cross_entropy(logits[own], torch.tensor(ids)[1:][own])
            assert trained == pytest.approx(float(nll), rel=1e-5)
            everything = torch.nn.functional.cross_entropy(logits, torch.tensor(ids)[1:])
            assert trained != pytest.approx(float(everything), rel=1e-3)
