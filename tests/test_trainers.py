"""SFT data building and training on the CPU with the tiny model."""

import json

import pytest

from thresher.trainers.data import IGNORE, build_examples, encode
from thresher.trainers.sft import TrainSpec, load_model, train


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def chat_row(q, a):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


@pytest.mark.parametrize("style", ["chat", "plain"])
def test_labels_mask_the_prompt_and_keep_the_answer(tokenizer, style):
    row = (
        chat_row("What is 2 + 3?", " 5")
        if style == "chat"
        else {"prompt": "What is 2 + 3?", "completion": " 5"}
    )
    [ex], report = build_examples([row], tokenizer, max_len=128)
    prompt_ids, answer_ids = encode(row, tokenizer)
    n = len(prompt_ids)
    assert ex["labels"][:n] == [IGNORE] * n
    assert ex["labels"][n:] == ex["input_ids"][n:] == answer_ids
    assert answer_ids[-1] == tokenizer.eos_token_id
    if style == "chat":
        prompt_text = tokenizer.decode(ex["input_ids"][:n])
        assert prompt_text.endswith("assistant:") and "5" not in prompt_text
    assert tokenizer.decode(answer_ids, skip_special_tokens=True).strip() == "5"
    assert report.examples == 1


def test_truncation_keeps_the_prompt_and_never_empties_the_answer(tokenizer):
    long_answer = " " + "the answer is long " * 40
    rows = [
        chat_row("Q?", long_answer),
        {"prompt": "P " * 200, "completion": " x"},
        {"prompt": "ok?", "completion": " fine"},
        {"prompt": "no answer"},
    ]
    examples, report = build_examples(rows, tokenizer, max_len=32)
    assert report.rows == 4 and report.examples == 2 and report.truncated == 1
    assert report.skipped["prompt fills max_len"] == 1
    assert sum(v for k, v in report.skipped.items() if k.startswith("malformed")) == 1
    for ex in examples:
        assert len(ex["input_ids"]) <= 32
        assert any(label != IGNORE for label in ex["labels"])


def test_lora_touches_attention_and_mlp(tiny_model):
    model, _ = load_model(TrainSpec(base_model=str(tiny_model), lora_r=8, lora_alpha=16))
    wrapped = {
        name.split(".")[-1]
        for name, _ in model.named_modules()
        if hasattr(_, "lora_A") and len(_.lora_A)
    }
    assert wrapped >= {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@pytest.fixture(scope="module")
def memorised(tiny_model, tmp_path_factory, made_up_pairs):
    out = tmp_path_factory.mktemp("sft")
    metrics = []
    spec = TrainSpec(
        base_model=str(tiny_model),
        learning_rate=3e-3,
        max_steps=120,
        batch_size=6,
        max_len=64,
        eval_fraction=0.0,
        save_every=1000,
        lora_r=16,
        lora_alpha=32,
        warmup_ratio=0.0,
    )
    result = train(
        spec,
        [chat_row(q, a) for q, a in made_up_pairs],
        out,
        on_metrics=metrics.extend,
        progress=False,
    )
    return result, metrics, out


def test_loss_drops(memorised):
    result, metrics, _ = memorised
    assert result.steps == 120 and [m["step"] for m in metrics] == list(range(1, 121))
    first = sum(m["loss"] for m in metrics[:5]) / 5
    last = sum(m["loss"] for m in metrics[-5:]) / 5
    assert last < first / 5
    assert result.tokens_per_s > 0


def test_trained_model_answers_greedily(memorised, tokenizer, made_up_pairs):
    import torch
    from transformers import AutoModelForCausalLM

    result, _, out = memorised
    model = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    for q, a in made_up_pairs:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            gen = model.generate(
                ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        assert tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True).strip() == a
    lineage = json.loads((out / "thresher_train.json").read_text())
    assert lineage["spec"]["base_model"] and lineage["result"]["steps"] == 120
