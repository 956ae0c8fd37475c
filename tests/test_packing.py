"""Packed training batches: the same loss and gradients as one example a row, no attention
across examples, and configs without packing identified as before."""

import random

import pytest

from thresher.config import TrainConfig, TrainSettings
from thresher.trainers.data import (
    IGNORE,
    batch_shape,
    build_examples,
    collate,
    collate_packed,
    pack,
)
from thresher.trainers.sft import _backward, load_model


def test_pack_is_best_fit_decreasing_and_respects_capacity():
    lengths = [5, 9, 3, 7, 1, 4, 10]
    bins = pack(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    # 39 tokens in bins of 10 need 4; best-fit decreasing finds them
    assert len(bins) == 4 and pack(lengths, 10) == bins
    assert batch_shape(lengths, True) == (4, 10)  # capacity: the longest example
    assert batch_shape(lengths, False) == (7, 10)


def test_packing_is_on_by_default_and_not_part_of_a_runs_identity():
    from thresher.config import BootstrapConfig
    from thresher.identities import bootstrap_run_id, fields_of, train_run_id

    cfg = TrainConfig(name="t", base_model="m")
    assert cfg.packing is True
    assert "packing" not in fields_of(cfg, "train")  # how rows are laid out, not what is learned
    unpacked = TrainConfig(name="t", base_model="m", packing=False)
    assert unpacked.model_dump()["packing"] is False
    assert TrainConfig(**unpacked.model_dump()) == unpacked  # a round trip keeps it off
    rows = [{"prompt": "p", "completion": "c"}]
    # the same examples laid out in other rows: the same run (resumable either way)
    assert train_run_id(cfg, rows) == train_run_id(unpacked, rows)
    assert train_run_id(cfg, rows) != train_run_id(cfg, [{"prompt": "p", "completion": "d"}])
    base = {
        "name": "b",
        "base_model": "m",
        "prompts": {"dataset": "d"},
        "eval": {"prompts": {"dataset": "d", "split": "eval"}},
    }
    assert bootstrap_run_id(BootstrapConfig(**base)) == bootstrap_run_id(
        BootstrapConfig(**base, train={"packing": False})
    )


@pytest.fixture(scope="module")
def examples(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rng = random.Random(0)
    rows = []
    for k in range(12):
        a, b = rng.randrange(50), rng.randrange(50)
        steps = " ".join(f"{a} plus {b} is {a + b}." for _ in range(rng.randrange(1, 8)))
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} + {b}?" + " Think." * (k % 3)},
                    {"role": "assistant", "content": f" {steps} The answer is {a + b}."},
                ]
            }
        )
    built, _ = build_examples(rows, tokenizer, max_len=256)
    lengths = [len(e["input_ids"]) for e in built]
    assert max(lengths) > 2 * min(lengths)  # varied, so unpacked batches carry padding
    return built, tokenizer.pad_token_id


def _loss_and_grads(model, examples, pad, packing):
    model.zero_grad(set_to_none=True)
    group = [list(range(0, 5)), list(range(5, 12))]  # two micro-batches: grad accumulation
    loss = _backward(model, examples, group, pad, "cpu", packing=packing)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss, grads


@pytest.mark.parametrize("method", ["full", "lora"])
def test_packed_batches_give_the_same_loss_and_gradients(tiny_model, examples, method):
    import torch

    built, pad = examples
    torch.manual_seed(0)
    model, _ = load_model(str(tiny_model), TrainSettings(method=method, lora={"r": 8}))
    if method == "lora":  # LoRA B starts at zero; make the adapters count
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
    model.train()
    loss, grads = _loss_and_grads(model, built, pad, False)
    packed_loss, packed_grads = _loss_and_grads(model, built, pad, True)
    # the packing really packed: fewer rows than examples in each micro-batch
    assert collate_packed(built[5:12], pad)["input_ids"].shape[0] < 7
    assert packed_loss == pytest.approx(loss, abs=1e-6)
    assert grads.keys() == packed_grads.keys() and grads
    for name, g in grads.items():
        assert torch.allclose(g, packed_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("packing", [False, True])
def test_logits_at_answer_positions_only_give_the_models_own_loss(
    tiny_model, examples, method, packing
):
    import torch

    from thresher.trainers.sft import answer_loss

    built, pad = examples
    torch.manual_seed(0)
    model, _ = load_model(str(tiny_model), TrainSettings(method=method, lora={"r": 8}))
    model.train()
    batch = collate_packed(built, pad) if packing else collate(built, pad)
    if packing:
        batch["use_cache"] = False
    sides = []
    for fn in (lambda: model(**batch).loss, lambda: answer_loss(model, batch)):
        model.zero_grad(set_to_none=True)
        loss = fn()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        sides.append((float(loss), grads))
    (full, full_grads), (ours, our_grads) = sides
    assert ours == pytest.approx(full, abs=1e-6)
    assert full_grads.keys() == our_grads.keys() and full_grads
    for name, g in full_grads.items():
        assert torch.allclose(g, our_grads[name], atol=1e-6, rtol=1e-5), name


def test_packed_examples_do_not_attend_to_each_other(tiny_model, examples):
    import torch
    from transformers import AutoModelForCausalLM

    built, pad = examples
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    three = [built[0], built[1], built[2]]
    batch = collate_packed(three, pad, 10_000)
    assert batch["input_ids"].shape[0] == 1  # all three in one row
    changed = [built[0], {**built[1], "input_ids": [7] * len(built[1]["input_ids"])}, built[2]]
    other = collate_packed(changed, pad, 10_000)
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert len(starts) == 3  # no padding: the row is exactly the three examples
    spans = list(zip(starts, [*starts[1:], batch["input_ids"].shape[1]], strict=True))
    which = [next(s for s in spans if s[1] - s[0] == len(e["input_ids"])) for e in three]
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits[0]
        logits_other = model(**other, use_cache=False).logits[0]
        alone = [model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in three]
    changed_span = which[1]
    for k, (a, b) in enumerate(which):
        if (a, b) == changed_span:
            assert not torch.allclose(logits[a:b], logits_other[a:b])
            continue
        assert torch.equal(logits[a:b], logits_other[a:b]) or torch.allclose(
            logits[a:b], logits_other[a:b], atol=1e-6
        )
        # and each packed example scores as it does alone
        assert torch.allclose(logits[a:b], alone[k], atol=1e-5)


def test_each_examples_first_label_is_masked(examples):
    built, pad = examples
    batch = collate_packed(built, pad)
    labels, positions = batch["labels"], batch["position_ids"]
    assert (labels[positions == 0] == IGNORE).all()
    answer_tokens = sum(sum(t != IGNORE for t in e["labels"][1:]) for e in built)
    assert int((labels != IGNORE).sum()) == answer_tokens


def test_a_packed_run_follows_the_unpacked_run_with_less_padding(tiny_model, tmp_path):
    from thresher.trainers.sft import train

    rng = random.Random(1)
    rows = [
        {"prompt": f"What is {k} + 1?", "completion": f" {k} and one more" * rng.randrange(1, 9)}
        for k in range(16)
    ]
    runs = {}
    for packing in (False, True):
        metrics = []
        spec = TrainSettings(
            packing=packing,
            max_steps=3,
            batch_size=8,
            max_len=128,
            eval_fraction=0.0,
            log_every=1,
            output="adapter",
            lora={"r": 8, "alpha": 16},
        )
        out = tmp_path / str(packing)
        result = train(spec, str(tiny_model), rows, out, metrics.extend, progress=False)
        runs[packing] = result, [m["loss"] for m in metrics]
    (plain, plain_losses), (packed, packed_losses) = runs[False], runs[True]
    assert packed_losses == pytest.approx(plain_losses, abs=1e-5)
    assert plain.rows == plain.unpacked_rows == packed.unpacked_rows == 3 * 8
    assert packed.rows < plain.rows and packed.row_tokens < plain.row_tokens
    assert packed.tokens == plain.tokens
    assert 0 <= packed.padding_share < plain.padding_share == plain.unpacked_padding_share
    assert packed.unpacked_padding_share == plain.padding_share
