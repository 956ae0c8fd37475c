"""A tiny Llama model and byte-level BPE tokenizer, built locally for demos and tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]


def arithmetic_examples(seed: int = 0) -> list[dict]:
    """Every single-digit sum and product as a prompt with its worked answer.

    One in five goes to the `eval` split; the rest are `train`.
    """
    rows = []
    for a in range(10):
        for b in range(10):
            for op, value in (("+", a + b), ("*", a * b)):
                rows.append(
                    {
                        "id": f"{a}{op}{b}",
                        "prompt": f"What is {a} {op} {b}?",
                        "answer": str(value),
                        "completion": f" {a} {op} {b} = {value}. The answer is {value}.",
                    }
                )
    random.Random(seed).shuffle(rows)
    for i, row in enumerate(rows):
        row["split"] = "eval" if i % 5 == 0 else "train"
    return rows


def build_tokenizer(texts: list[str], vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on `texts` and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(
    out_dir: str | Path,
    examples: list[dict] | None = None,
    train_steps: int = 0,
    seed: int = 0,
) -> Path:
    """Save a ~0.4M-parameter Llama (head size 64) and tokenizer to `out_dir`.

    With `train_steps` > 0 the model is first trained on prompt+completion texts
    (by default the train split of `arithmetic_examples`), so it answers some of them
    correctly: a stand-in for a pretrained model in demos and tests.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    if examples is None:
        examples = [e for e in arithmetic_examples() if e["split"] == "train"]
    texts = [e["prompt"] + e["completion"] for e in examples]
    chat_texts = [f"user: {e['prompt']}\nassistant:{e['completion']}" for e in examples]
    tokenizer = build_tokenizer(texts + chat_texts)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    if train_steps > 0:
        _fit(model, tokenizer, texts + chat_texts, train_steps, seed)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "thresher_tiny.json").write_text(
        json.dumps({"train_steps": train_steps, "seed": seed, "examples": len(examples)})
    )
    return out


def _fit(model, tokenizer, texts: list[str], steps: int, seed: int) -> None:
    """Plain causal-LM training so the tiny model learns the example texts."""
    import torch

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = torch.tensor(e)
    labels = ids.masked_fill(ids == pad, -100)
    attention = (ids != pad).long()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(encoded), (64,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=attention[idx], labels=labels[idx]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
