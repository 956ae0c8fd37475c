"""The gates: checks a pipeline must pass before it samples anything, and those a bootstrap
round must pass before it trains and after it evaluates. Each gate is a function of a
`GateAt` that raises a `GateFailed` to stop the run, returning what it measured."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thresher.config import BootstrapConfig, CurateConfig
from thresher.evaluators.audit import check_round
from thresher.evaluators.audit_sheet import write_sheet
from thresher.evaluators.monitors import check_monitors
from thresher.flows.summaries import CurateSummary
from thresher.ids import content_id
from thresher.stores.lake import Lake, now
from thresher.stores.runs import tracked_run
from thresher.verifiers import checked_options, verifier_class
from thresher.verifiers.base import GateRefused
from thresher.verifiers.reward import model_key, pairwise_accuracy


def pipeline_gates(lake: Lake, cfg: CurateConfig | BootstrapConfig) -> dict[str, Any] | None:
    """The checks a curate or bootstrap pipeline must pass before it samples anything: each
    of its verifiers' gate (`Verifier.gate`; the reward model's measured pairwise accuracy).
    Returns the figure a gate recorded (None: none did; by verifier when several did).
    Raises GateRefused (RewardModelRejected) when a gate refuses or a verifier's options are
    bad."""
    if isinstance(cfg, BootstrapConfig):
        cfg = cfg.curate_config(0, cfg.base_model)
    figures = {}
    for name in cfg.verify.all_names():
        cls = verifier_class(name)
        options = checked_options(name, cfg.verify.options.get(name), GateRefused)
        figure = cls.gate(lake, options, cfg.gates)
        if figure is not None:
            figures[name] = figure
    if len(figures) > 1:
        return figures
    return next(iter(figures.values()), None)


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
    key = model_key(model)
    run_id = content_id("rm-check", key, config, now().isoformat())
    run = dict(flow="rm-check", round_=round_, model=key, config=config)
    with tracked_run(lake, run_id, **run) as summary:
        result = pairwise_accuracy(key, pairs, batch_size=batch_size, max_length=max_length)
        summary.update(result, source=source, run_id=run_id)
    return summary


@dataclass(frozen=True)
class GateAt:
    """Where a gate looks: the lake, the pipeline's config, the round, and what the round
    has measured so far (its curate summary, its forgetting checks)."""

    lake: Lake | None
    cfg: BootstrapConfig
    round: int = 0
    curated: CurateSummary | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)


class GateFailed(ValueError):
    """A gate stopped the run: an expected stop, with its reason and figures."""


class AuditGateFailed(GateFailed):
    """A round's labelled false-pass rate is over the configured gate (or unmeasured)."""


class MonitorsGateFailed(GateFailed):
    """A round's monitors broke a threshold of the configured gate (config `monitors`)."""


class ForgettingGateFailed(GateFailed):
    """A round's model lost more than max_drop of pass@1 on a forgetting check."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def audit_gate(at: GateAt) -> None:
    """Raise AuditGateFailed, after writing an audit sheet of the round, unless the round's
    labelled false-pass rate holds (config `audit`)."""
    gate, cfg, round_ = at.cfg.audit, at.cfg, at.round
    if gate is None or at.lake is None:
        return
    result = check_round(
        at.lake, cfg.name, round_, gate.max_false_pass, gate.min_labels, gate.verifiers
    )
    for line in result.lines:
        _say(f"round {round_} audit: {line}")
    if result.passed:
        return
    sheet = write_sheet(at.lake, round_, at.lake.local_dir("audits"), cfg.name, gate.sheet_size)
    raise AuditGateFailed(
        f"round {round_} of {cfg.name} stopped at the audit gate before training: "
        + "; ".join(result.lines)
        + f". Label {sheet.html} (or {sheet.csv}), run `thresher audit import FILE`, fix "
        "the verifier if it is wrong, then run the bootstrap again: finished steps are reused"
    )


def monitors_gate(at: GateAt) -> None:
    """Raise MonitorsGateFailed, with one line naming each broken threshold, unless the
    round's monitors hold the thresholds of config `monitors`."""
    if at.cfg.monitors is None:
        return
    monitors = (at.curated.monitors if at.curated else None) or {}
    broken = check_monitors(monitors, at.cfg.monitors)
    if broken:
        raise MonitorsGateFailed(
            f"round {at.round} of {at.cfg.name} stopped at the monitors gate before training: "
            + "; ".join(broken)
            + ". Look at the round (view round_monitors, `thresher report`), relax "
            "`monitors:` if the threshold is wrong, then run the bootstrap again: finished "
            "steps are reused"
        )


def forgetting_gate(at: GateAt) -> None:
    """Raise ForgettingGateFailed when model `at.round` dropped below the base model on a
    forgetting check by more than its max_drop."""
    over = [r for r in at.checks if r["max_drop"] is not None and r["drop"] > r["max_drop"] + 1e-9]
    if over:
        raise ForgettingGateFailed(
            f"{at.cfg.name} stopped at the forgetting check: "
            + "; ".join(
                f"model {at.round} scores pass@1 {r['pass@1']:.3f} on {r['check']} against "
                f"the base model's {r['base_pass@1']:.3f}, a drop of {r['drop']:.3f} over "
                f"max_drop {r['max_drop']}"
                for r in over
            )
        )


# the gates a bootstrap round passes, in order, at each point of the round
BEFORE_TRAINING: tuple[Callable[[GateAt], None], ...] = (audit_gate, monitors_gate)
AFTER_EVALUATION: tuple[Callable[[GateAt], None], ...] = (forgetting_gate,)
