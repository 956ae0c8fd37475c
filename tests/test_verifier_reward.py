"""The reward-model verifier with a tiny randomly initialised model (`tiny_reward_model`)."""

import gc
import weakref

import polars as pl
import pytest

from thresher.verifiers import reward
from thresher.verifiers.reward import RewardModel


def batch():
    texts = [
        " 2 + 2 = 4. The answer is 4.",
        " 5",
        " 2 + 2 = 5. The answer is 5.",
        " I do not know, sorry.",
        " 9",
    ]
    return pl.DataFrame(
        {
            "candidate_id": [f"c{i}" for i in range(5)],
            "prompt_id": ["p1", "p1", "p1", "p2", "p2"],
            "prompt": ["What is 2 + 2?"] * 3 + ["What is 4 + 5?"] * 2,
            "messages": [None] * 5,
            "text": texts,
        }
    )


def test_scores_do_not_depend_on_batching(tiny_reward_model):
    rows = batch().to_dicts()
    together = RewardModel(tiny_reward_model, batch_size=8).scores(rows)
    alone = [RewardModel(tiny_reward_model, batch_size=1).scores([r])[0] for r in rows]
    assert together == pytest.approx(alone, abs=1e-4)
    assert len(set(round(s, 6) for s in together)) > 1


def test_threshold_and_top_n(tiny_reward_model):
    scores = RewardModel(tiny_reward_model).scores(batch().to_dicts())
    cut = sorted(scores)[2]
    out = RewardModel(tiny_reward_model, threshold=cut).run(batch())
    assert out["passed"].to_list() == [s >= cut for s in scores]
    assert out["score"].to_list() == pytest.approx(scores)
    top = RewardModel(tiny_reward_model, top_n=1).run(batch())
    per_prompt = top.with_columns(p=batch()["prompt_id"]).group_by("p").agg(pl.col("passed").sum())
    assert sorted(per_prompt["passed"].to_list()) == [1, 1]
    with pytest.raises(ValueError, match="not both"):
        RewardModel(tiny_reward_model, threshold=0.0, top_n=1)


def live_reward_models(path: str) -> list:
    """Reward models loaded from `path` that something still references."""
    from transformers import LlamaForSequenceClassification

    gc.collect()
    return [
        o
        for o in gc.get_objects()
        if type(o) is LlamaForSequenceClassification and o.config.name_or_path == path
    ]


def test_run_frees_the_model_when_it_is_done(tiny_reward_model):
    RewardModel(tiny_reward_model).run(batch())
    assert reward.loaded() == [] and live_reward_models(tiny_reward_model) == []
    RewardModel(tiny_reward_model).scores(batch().to_dicts())
    assert reward.loaded() == [] and live_reward_models(tiny_reward_model) == []


def test_a_failed_run_frees_the_model_too(tiny_reward_model):
    bad = batch().drop("text")
    with pytest.raises(KeyError) as failure:
        RewardModel(tiny_reward_model).run(bad)
    # the error is still held (as a retried task's state holds it) yet the model is gone
    assert failure.value.__traceback__ is not None
    assert reward.loaded() == [] and live_reward_models(tiny_reward_model) == []


def test_keep_holds_the_model_until_release(tiny_reward_model):
    verifier = RewardModel(tiny_reward_model)
    first = verifier.run(batch(), keep=True)
    [model] = live_reward_models(tiny_reward_model)
    ref = weakref.ref(model)
    del model
    again = verifier.run(batch(), keep=True)  # scored by the same loaded model
    assert live_reward_models(tiny_reward_model) == [ref()]
    assert again["score"].to_list() == first["score"].to_list()
    reward.release()
    gc.collect()
    assert ref() is None and reward.loaded() == []
