"""A tiny Llama model and byte-level BPE tokenizer, built locally for demos and tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from thresher.ingest.synthetic import (
    TOOL_SPLITS,
    WORD_SPLITS,
    arithmetic_examples,
    arithmetic_facts,
    tool_problems,
    word_problems,
)

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedTokenizerFast

# The assistant's answer follows "assistant:" and ends with EOS, exactly as the model
# samples it (its answers start with a space), so training on sampled answers reproduces
# the sampled text instead of adding a space and a newline each round. An answer written
# without the leading space gets one.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "assistant:{% if not m['content'].startswith(' ') %} {% endif %}"
    "{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]


def build_tokenizer(texts: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
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


def llama_config(tokenizer, hidden: int, layers: int, **extra) -> LlamaConfig:
    """A small Llama config sized to `tokenizer`: two heads, an MLP twice `hidden` wide."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


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
    if examples is None:
        examples = [e for e in arithmetic_examples() if e["split"] == "train"]
    texts = [e["prompt"] + e["completion"] for e in examples]
    chat_texts = [chat_text(e["prompt"], e["completion"]) for e in examples]
    info = {"train_steps": train_steps, "seed": seed, "examples": len(examples)}
    return _build(out_dir, texts + chat_texts, train_steps, seed, info)


def make_word_problem_model(
    out_dir: str | Path, train_steps: int = 300, seed: int = 0, more: int = 0
) -> Path:
    """The demo's base model: a tiny Llama trained from scratch on the arithmetic facts
    and 100 worked word problems (the `seed` split of `word_problems`, which shares no
    problem with the bundled train and eval splits), and `more` others (none of them in
    the bundled splits either: a stronger model of the same task, to teach with).

    It knows the facts but applies them to word problems unreliably: sampled pass@1 on
    held-out problems is low while pass@8 is much higher, the gap bootstrapping closes.
    """
    rows = word_problems({**WORD_SPLITS, "more": more} if more else WORD_SPLITS)
    seed_rows = [r for r in rows if r["split"] in ("seed", "more")]
    texts = [chat_text(r["prompt"], r["completion"]) for r in seed_rows] + arithmetic_facts()
    info = {"train_steps": train_steps, "seed": seed, "examples": len(seed_rows), "task": "word"}
    return _build(out_dir, texts, train_steps, seed, info)


def make_tool_model(
    out_dir: str | Path, train_steps: int = 500, seed: int = 0, examples: int | None = None
) -> Path:
    """A tiny Llama that has learnt to ask a Python tool for sums, differences and products:
    trained on 400 worked two-digit word problems, each a ```python print(a op b)``` call,
    the tool's output and the answer read from it (the `seed` split of `tool_problems`).

    It copies the numbers and picks the operation unreliably, so its pass@1 with the tool
    is low and rises as rounds train it on its correct calls; without the tool it has to
    make the output up."""
    seed_rows = [r for r in tool_problems(TOOL_SPLITS) if r["split"] == "seed"][:examples]
    texts = [chat_text(r["prompt"], r["completion"]) for r in seed_rows]
    info = {"train_steps": train_steps, "seed": seed, "examples": len(seed_rows), "task": "tool"}
    return _build(out_dir, texts, train_steps, seed, info)


def chat_text(prompt: str, completion: str) -> str:
    """A prompt and its answer as the tiny chat template renders them (without EOS)."""
    return f"user: {prompt}\nassistant:{completion}"


def _build(out_dir: str | Path, texts: list[str], train_steps: int, seed: int, info: dict) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    out = Path(out_dir)
    tokenizer = build_tokenizer(texts)
    torch.manual_seed(seed)
    config = llama_config(
        tokenizer,
        hidden=128,
        layers=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    if train_steps > 0:
        _fit(model, tokenizer, texts, train_steps, seed)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "thresher_tiny.json").write_text(json.dumps(info))
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
