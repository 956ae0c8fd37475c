"""Checks a pipeline must pass before it samples anything."""

from __future__ import annotations

from typing import Any

from thresher.config import BootstrapConfig, CurateConfig
from thresher.stores.lake import Lake


def pipeline_gates(lake: Lake, cfg: CurateConfig | BootstrapConfig) -> dict[str, Any] | None:
    """The checks a curate or bootstrap pipeline must pass before it samples anything: its
    reward model's measured pairwise accuracy (None: it uses no reward model). Raises
    RewardModelRejected when the gate refuses."""
    if isinstance(cfg, BootstrapConfig):
        cfg = cfg.curate_config(0, cfg.base_model)
    return reward_model_check(lake, cfg)


def reward_model_check(lake: Lake, cfg: CurateConfig) -> dict[str, Any] | None:
    """The pairwise accuracy of the reward model the config verifies with, as its latest
    `thresher rm-check` measured it (None: the config uses no reward model); raises
    RewardModelRejected when it is missing or below gates.min_pairwise_accuracy and
    gates.force_reward_model is not set."""
    from thresher.stores.runs import latest_rm_check
    from thresher.verifiers import reward_model_option
    from thresher.verifiers.reward import RewardModelRejected, model_key, reward_model_gate

    if "reward" not in cfg.verify.all_names():
        return None
    model = reward_model_option(cfg.verify.options)
    if not model:
        raise RewardModelRejected(
            "the reward verifier needs a model: set verify.options.reward.model"
        )
    key = model_key(str(model))
    gates = cfg.gates
    return reward_model_gate(
        key, latest_rm_check(lake, key), gates.min_pairwise_accuracy, gates.force_reward_model
    )


def record_rm_check(
    lake: Lake,
    model: str,
    pairs: list[dict[str, Any]],
    *,
    source: str,
    config: dict[str, Any],
    round_: int | None = None,
    batch_size: int = 16,
    max_length: int = 2048,
) -> dict[str, Any]:
    """Score `pairs` with reward model `model` and record the check as an `rm-check` run
    (model: model_key(model)); returns its summary: pairs, correct, ties, accuracy, low,
    high, source."""
    from thresher.ids import content_id
    from thresher.stores.lake import now
    from thresher.stores.runs import tracked_run
    from thresher.verifiers.reward import model_key, pairwise_accuracy

    key = model_key(model)
    run_id = content_id("rm-check", key, config, now().isoformat())
    run = dict(flow="rm-check", round_=round_, model=key, config=config)
    with tracked_run(lake, run_id, **run) as summary:
        result = pairwise_accuracy(key, pairs, batch_size=batch_size, max_length=max_length)
        summary.update(result, source=source, run_id=run_id)
    return summary
