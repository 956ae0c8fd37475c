"""SFT data building and training on the CPU with the tiny model."""

import json

import pytest
from helpers import train_settings

from thresher.config import TrainSettings
from thresher.trainers.data import IGNORE, build_examples, encode
from thresher.trainers.sft import eval_split_size, load_model, train


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
    model, _ = load_model(str(tiny_model), TrainSettings(lora={"r": 8, "alpha": 16}))
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
    spec = train_settings(max_steps=120, batch_size=6, lora={"r": 16, "alpha": 32})
    result = train(
        spec,
        str(tiny_model),
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


# Like the tiny model's template, except that once the conversation ends with the answer,
# earlier answers lose their reasoning (as templates of reasoning models do): the prompt
# rendered for sampling is then not a prefix of the rendered training conversation.
REWRITING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}assistant: "
    "{% if not loop.last and messages[-1]['role'] == 'assistant' %}"
    "{{ m['content'].split('so')[-1].strip() }}"
    "{% else %}{{ m['content'].strip() }}{% endif %}{{ eos_token }}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def two_turn_row(i: int) -> dict:
    """A follow-up question whose earlier answer has reasoning the template strips."""
    return {
        "messages": [
            {"role": "user", "content": f"What is {i} + 1?"},
            {"role": "assistant", "content": f" {i} + 1 = {i + 1}, so {i + 1}"},
            {"role": "user", "content": "And plus 2?"},
            {"role": "assistant", "content": f" {i + 2}"},
        ]
    }


@pytest.fixture(scope="module")
def rewriting_model(tiny_model, tmp_path_factory):
    """The tiny model with REWRITING_TEMPLATE as its chat template."""
    import shutil

    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("rewriting") / "model"
    out.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(tiny_model / name, out / name)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = REWRITING_TEMPLATE
    tok.save_pretrained(out)
    return out


def test_answers_of_rewritten_conversations_are_counted_as_fallbacks(rewriting_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rewriting_model)
    rows = [two_turn_row(1), two_turn_row(2), chat_row("What is 2 + 3?", " 5")]
    examples, report = build_examples(rows, tok, max_len=128)
    assert report.examples == 3 and report.fallback_examples == 2
    assert "2 of 3 examples train on the raw answer text" in report.fallback_note()
    answer = [t for t in examples[0]["labels"] if t != IGNORE]
    assert tok.decode(answer, skip_special_tokens=True) == " 3"  # the raw answer
    assert build_examples(rows[2:], tok, max_len=128)[1].fallback_note() is None


@pytest.mark.parametrize(
    ("n", "fraction", "held_out", "why"),
    [
        (12, 0.1, 0, "eval_fraction 0.1 needs at least 20 examples; got 12"),
        (12, 0.0, 0, None),
        (20, 0.1, 2, None),
        (30, 0.03, 0, "eval_fraction 0.03 of 30 examples is under 1 example"),
    ],
)
def test_eval_split_size_says_why_there_is_none(n, fraction, held_out, why):
    assert eval_split_size(n, fraction) == (held_out, why)


def train_briefly(model, rows, out, eval_fraction) -> tuple:
    """A two-step LoRA run; (result, what it wrote to stderr)."""
    import contextlib
    import io

    spec = TrainSettings(
        max_steps=2,
        batch_size=4,
        max_len=64,
        eval_fraction=eval_fraction,
        log_every=1,
        lora={"r": 4, "alpha": 8},
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = train(spec, str(model), rows, out, progress=False)
    return result, err.getvalue()


def test_train_reports_fallbacks_and_a_skipped_eval_split(rewriting_model, tmp_path):
    rows = [two_turn_row(i) for i in range(9)] + [
        chat_row(f"What is {i} + 0?", f" {i}") for i in range(3)
    ]
    result, err = train_briefly(rewriting_model, rows, tmp_path, eval_fraction=0.1)
    assert result.examples == 12 and result.fallback_examples == 9
    assert result.eval_examples == 0 and result.eval_loss is None
    assert result.eval_skipped == "eval_fraction 0.1 needs at least 20 examples; got 12"
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "9 of 12 examples train on the raw answer text" in warnings[0]
    assert warnings[1] == f"warning: no eval split: {result.eval_skipped}"
    lineage = json.loads((tmp_path / "thresher_train.json").read_text())["result"]
    assert lineage["fallback_examples"] == 9 and lineage["eval_skipped"] == result.eval_skipped


def test_train_holds_out_an_eval_split_without_warnings(tiny_model, tmp_path):
    rows = [chat_row(f"What is {i} + {j}?", f" {i + j}") for i in range(5) for j in range(4)]
    result, err = train_briefly(tiny_model, rows, tmp_path, eval_fraction=0.1)
    assert result.examples == 20 and result.eval_examples == 2 and result.eval_loss is not None
    assert result.eval_skipped is None and result.fallback_examples == 0
    assert "warning:" not in err


def test_early_stopping_stops_before_its_steps_and_keeps_the_best_step(tiny_model, tmp_path):
    """Random answers to random questions: training memorises them and held-out loss turns
    up, so the run stops long before its 400 steps, and the model it writes is the best
    step's, not the last one's."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    rng = random.Random(0)
    words = ["seven", "blue", "river", "nine", "stone", "apple", "cloud", "four"]
    rows = [
        chat_row(" ".join(rng.choices(words, k=4)) + "?", " " + " ".join(rng.choices(words, k=5)))
        for _ in range(40)
    ]
    metrics = []
    settings = train_settings(
        method="full",
        learning_rate=1e-2,
        max_steps=400,
        batch_size=8,
        eval_fraction=0.25,
        eval_every=2,
        log_every=1000,
        early_stopping={"patience": 3},
    )
    result = train(settings, str(tiny_model), rows, tmp_path, metrics.extend, progress=False)
    evals = [(m["step"], m["eval_loss"]) for m in metrics if m["eval_loss"] is not None]
    assert result.stopped_early and result.steps < 400
    best_step, best_loss = min(evals, key=lambda e: e[1])
    assert (result.best_step, result.best_eval_loss) == (best_step, best_loss)
    # it stopped after `patience` evaluations without a better loss
    assert [s for s, _ in evals][-1] == result.steps == best_step + 3 * 2
    best = torch.load(tmp_path / "best" / "weights.pt", map_location="cpu")
    written = AutoModelForCausalLM.from_pretrained(result.model_dir).state_dict()
    assert all(torch.equal(written[k].float(), v.float()) for k, v in best.items() if k in written)
    last = torch.load(
        tmp_path / "checkpoints" / f"step-{result.steps}" / "weights.pt", map_location="cpu"
    )
    assert any(not torch.equal(last[k], best[k]) for k in best)


def test_early_stopping_needs_an_eval_split():
    with pytest.raises(ValueError, match="eval_fraction"):
        TrainSettings(early_stopping={"patience": 2}, eval_fraction=0.0)
