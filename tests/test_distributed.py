"""Training in two processes under torchrun (gloo, on the CPU), DDP and FSDP, against the
same training in one process: the same losses step by step, the same weights."""

import json
import shutil

import pytest
from helpers import train_settings

from thresher.config import TrainSettings
from thresher.trainers.launch import DistributedTrainingError, train_distributed
from thresher.trainers.sft import train

# made-up facts: 24 rows, 6 held out for the eval loss, 18 to train on
ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"What is {a} # {b}?"},
            {"role": "assistant", "content": str((a * 7 + b * 3) % 50)},
        ]
    }
    for a in range(4)
    for b in range(6)
]


def spec(**kw) -> TrainSettings:
    # batch_size 5 over 2 processes: slices of 3 and 2, and a last micro-batch of 3 (2 + 1);
    # the 6 eval rows make batches of 5 and 1, so one rank scores a stand-in row there
    base = dict(max_steps=6, batch_size=5, grad_accum=2, eval_fraction=0.25, eval_every=3)
    return train_settings(**{**base, "save_every": 3, "lora": {"r": 8, "alpha": 16}, **kw})


def run(tiny_model, out, processes=1, strategy="ddp", **kw):
    metrics = []
    s, base = spec(**kw), str(tiny_model)
    if processes == 1:
        result = train(s, base, ROWS, out, on_metrics=metrics.extend, progress=False)
    else:
        result = train_distributed(
            s, base, ROWS, out, processes, strategy, "gloo", metrics.extend, progress=False
        )
    return result, metrics, out


def resume_from(source, out, step: int):
    """A fresh output folder holding only `source`'s checkpoint of `step`."""
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(source / "checkpoints" / f"step-{step}", out / "checkpoints" / f"step-{step}")
    return out


@pytest.fixture(scope="module")
def one(tiny_model, tmp_path_factory):
    return run(tiny_model, tmp_path_factory.mktemp("one"))


@pytest.fixture(scope="module")
def one_full(tiny_model, tmp_path_factory):
    return run(tiny_model, tmp_path_factory.mktemp("one-full"), method="full")


def losses(metrics, key="loss"):
    return {m["step"]: m[key] for m in metrics if m[key] is not None}


def assert_same_training(metrics, reference, steps):
    assert [m["step"] for m in metrics] == steps
    ref = {m["step"]: m for m in reference}
    for m in metrics:
        assert m["loss"] == pytest.approx(ref[m["step"]]["loss"], rel=1e-4)
        if m["eval_loss"] is not None or ref[m["step"]]["eval_loss"] is not None:
            assert m["eval_loss"] == pytest.approx(ref[m["step"]]["eval_loss"], rel=1e-4)


def assert_same_weights(a, b, tol=1e-4):
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < tol


def test_one_process_learns(one):
    result, metrics, _ = one
    assert result.steps == 6 and [m["step"] for m in metrics] == list(range(1, 7))
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert metrics[-1]["eval_loss"] < metrics[2]["eval_loss"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one(strategy, one, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    ref_result, ref_metrics, ref_out = one
    result, metrics, out = run(tiny_model, tmp_path, 2, strategy)
    assert_same_training(metrics, ref_metrics, list(range(1, 7)))
    assert losses(metrics, "eval_loss").keys() == {3, 6}
    assert result.steps == 6 and result.tokens == ref_result.tokens
    assert result.final_loss == pytest.approx(ref_result.final_loss, rel=1e-4)
    assert AutoModelForCausalLM.from_pretrained(result.model_dir) is not None
    assert_same_weights(result.model_dir, ref_result.model_dir)
    lineage = json.loads((out / "thresher_train.json").read_text())
    assert lineage["distributed"] == {"processes": 2, "strategy": strategy}
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-6"]
    assert not (out / "launch" / "rows.jsonl").exists()


def test_ddp_resumes_a_one_process_checkpoint(one, tiny_model, tmp_path):
    _, ref_metrics, ref_out = one
    result, metrics, _ = run(tiny_model, resume_from(ref_out, tmp_path, 3), 2, "ddp")
    assert result.resumed_from == 3 and result.steps == 6
    assert_same_training(metrics, ref_metrics, [4, 5, 6])


def test_fsdp_full_training_resumes_and_saves_whole_weights(one_full, tiny_model, tmp_path):
    import torch

    ref_result, ref_metrics, ref_out = one_full
    out = resume_from(ref_out, tmp_path, 3)
    result, metrics, _ = run(tiny_model, out, 2, "fsdp", method="full")
    assert result.resumed_from == 3
    assert_same_training(metrics, ref_metrics, [4, 5, 6])
    assert metrics[-1]["loss"] < ref_metrics[0]["loss"] / 2
    # the sharded run's checkpoint is unsharded and laid out as one process writes it
    mine = torch.load(out / "checkpoints" / "step-6" / "weights.pt")
    ref = torch.load(ref_out / "checkpoints" / "step-6" / "weights.pt")
    assert mine.keys() == ref.keys()
    assert all(torch.allclose(mine[k], ref[k], atol=1e-4) for k in ref)
    assert_same_weights(result.model_dir, ref_result.model_dir)


def test_a_failed_launch_raises_with_the_end_of_its_log(tiny_model, tmp_path):
    with pytest.raises(DistributedTrainingError) as err:
        train_distributed(spec(), str(tiny_model), ROWS, tmp_path, 2, "ddp", "nccl", progress=False)
    message = str(err.value)
    assert "exited with code" in message and "backend nccl needs CUDA GPUs" in message
    assert (tmp_path / "launch" / "train.log").exists()


def test_config_keeps_one_process_by_default_and_a_global_batch():
    from pydantic import ValidationError

    from thresher.config import TrainConfig
    from thresher.identities import train_run_id

    cfg = TrainConfig(name="t", base_model="m", batch_size=4)
    assert cfg.distributed.processes == 1 and cfg.distributed.strategy == "ddp"
    two = TrainConfig(name="t", base_model="m", batch_size=4, distributed={"processes": 2})
    rows = [{"prompt": "q", "completion": "a"}]
    assert train_run_id(two, rows) == train_run_id(cfg, rows)  # resumes with another count
    assert train_run_id(cfg, rows) != train_run_id(cfg, [*rows, *rows])  # new data: new run
    with pytest.raises(ValidationError, match="global batch"):
        TrainConfig(name="t", base_model="m", batch_size=2, distributed={"processes": 4})
    with pytest.raises(ValidationError):
        TrainConfig(name="t", base_model="m", distributed={"strategy": "zero3"})
