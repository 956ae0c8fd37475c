"""A tiny Llama model and byte-level BPE tokenizer, built locally for demos and tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

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


NAMES = ["Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kai", "Lea"]
OBJECTS = ["apple", "book", "coin", "shell", "card", "stamp", "marble", "pen", "cup", "kite"]
WORD_TEMPLATES = {
    "+": [
        "{n} has {a} {o}s and finds {b} more. How many {o}s does {n} have now?",
        "{n} had {a} {o}s. A friend gave {n} {b} more. How many {o}s does {n} have?",
    ],
    "-": [
        "{n} has {a} {o}s and gives {b} away. How many {o}s are left?",
        "{n} had {a} {o}s and lost {b} of them. How many {o}s does {n} have left?",
    ],
    "*": [
        "{n} has {a} boxes with {b} {o}s in each box. How many {o}s does {n} have in all?",
        "{n} buys {a} packs of {b} {o}s. How many {o}s does {n} buy?",
    ],
}


def _word_problem(rng: random.Random) -> dict:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        value = a * b
    elif op == "+":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        value = a + b
    else:
        b, value = rng.randint(1, 9), rng.randint(1, 9)
        a = b + value
    text = rng.choice(WORD_TEMPLATES[op]).format(
        n=rng.choice(NAMES), o=rng.choice(OBJECTS), a=a, b=b
    )
    return {
        "prompt": text,
        "answer": str(value),
        "completion": f" {a} {op} {b} = {value}. The answer is {value}.",
    }


def word_problems(splits: dict[str, int], seed: int = 0) -> list[dict]:
    """One-step arithmetic word problems with worked answers, distinct across splits.

    `splits` maps a split name to its size, e.g. {"seed": 300, "train": 1000, "eval": 200};
    no problem text appears twice. Each row: id, split, prompt, answer, completion.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for split, size in splits.items():
        made = 0
        while made < size:
            row = _word_problem(rng)
            if row["prompt"] in seen:
                continue
            seen.add(row["prompt"])
            rows.append({"id": f"{split}-{made}", "split": split, **row})
            made += 1
    return rows


def write_word_problems(path: str | Path, n: int, seed: int = 0) -> Path:
    """`n` word problems as a JSONL file of prompt, answer, task (ready to ingest)."""
    import json

    rows = word_problems({"train": n}, seed=seed)
    Path(path).write_text(
        "".join(
            json.dumps({"prompt": r["prompt"], "answer": r["answer"], "task": "arithmetic"}) + "\n"
            for r in rows
        )
    )
    return Path(path)


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


def arithmetic_facts() -> list[str]:
    """Every fact the word problems use: a + b, (a + b) - b and a * b for small a, b."""
    facts = []
    for a in range(1, 10):
        for b in range(1, 10):
            facts += [f"{a} + {b} = {a + b}", f"{a + b} - {b} = {a}"]
    for a in range(2, 10):
        for b in range(2, 10):
            facts.append(f"{a} * {b} = {a * b}")
    return facts


WORD_SPLITS = {"seed": 100, "train": 1000, "eval": 200}


def make_word_problem_model(out_dir: str | Path, train_steps: int = 300, seed: int = 0) -> Path:
    """The demo's base model: a tiny Llama trained from scratch on the arithmetic facts
    and 100 worked word problems (the `seed` split of `word_problems`, which shares no
    problem with the bundled train and eval splits).

    It knows the facts but applies them to word problems unreliably: sampled pass@1 on
    held-out problems is low while pass@8 is much higher, the gap bootstrapping closes.
    """
    seed_rows = [r for r in word_problems(WORD_SPLITS) if r["split"] == "seed"]
    texts = [chat_text(r["prompt"], r["completion"]) for r in seed_rows] + arithmetic_facts()
    info = {"train_steps": train_steps, "seed": seed, "examples": len(seed_rows), "task": "word"}
    return _build(out_dir, texts, train_steps, seed, info)


def chat_text(prompt: str, completion: str) -> str:
    """A prompt and its answer as the tiny chat template renders them (without EOS)."""
    return f"user: {prompt}\nassistant:{completion}"


def _build(out_dir: str | Path, texts: list[str], train_steps: int, seed: int, info: dict) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    tokenizer = build_tokenizer(texts)
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


# The tool model's problems use two-digit numbers: too big for its facts, easy for Python.
TOOL_OUTPUT = "\n```output\n{output}\n```\n"  # sampling.tools.output's default


def _tool_problem(rng: random.Random) -> dict:
    op = rng.choice("+-*")
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    text = rng.choice(WORD_TEMPLATES[op]).format(
        n=rng.choice(NAMES), o=rng.choice(OBJECTS), a=a, b=b
    )
    call = f" ```python\nprint({a} {op} {b})\n```"
    return {
        "prompt": text,
        "answer": str(value),
        "completion": call + TOOL_OUTPUT.format(output=value) + f"The answer is {value}.",
    }


TOOL_SPLITS = {"seed": 400, "train": 1000, "eval": 200}


def tool_problems(splits: dict[str, int], seed: int = 0) -> list[dict]:
    """Word problems on two-digit numbers whose worked answers call Python for the sum,
    difference or product, distinct across splits (rows as `word_problems` makes them)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for split, size in splits.items():
        made = 0
        while made < size:
            row = _tool_problem(rng)
            if row["prompt"] in seen:
                continue
            seen.add(row["prompt"])
            rows.append({"id": f"{split}-{made}", "split": split, **row})
            made += 1
    return rows


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
