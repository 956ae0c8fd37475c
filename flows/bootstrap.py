"""The bootstrap flow: STaR / rejection-sampling fine-tuning, round after round.

Model 0 is the base model. Round r curates the training prompts with model r, trains
model r+1 on the kept data, and evaluates model r+1 on held-out prompts. Every step has
a content-derived run id, so re-running the same config skips what is finished and
resumes what is not; raising `max_rounds` adds rounds after the last one. The run is a
declared list of steps: `START_STEPS`, `ROUND_STEPS` for every round, `END_STEPS`.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.states import Failed

from thresher.config import BootstrapConfig
from thresher.evaluators.page import write_report
from thresher.evaluators.passk import FORMAT_METRIC
from thresher.evaluators.report import round_table
from thresher.flows.artifacts import publish
from thresher.flows.curate import curate_flow
from thresher.flows.evaluate import eval_flow
from thresher.flows.gates import (
    AFTER_EVALUATION,
    BEFORE_TRAINING,
    GateAt,
    GateFailed,
    pipeline_gates,
)
from thresher.flows.rounds import Rounds
from thresher.flows.runtime import deployment_cleanup, resolved, run_in_process, stop_engine
from thresher.flows.summaries import BootstrapSummary, CurateSummary, EvalSummary, TrainSummary
from thresher.flows.train import train_flow
from thresher.identities import bootstrap_run_id, digests_of
from thresher.ingest.envs import generate_round, held_out_levels
from thresher.stores.lake import Lake
from thresher.stores.models import model_path, set_best_pointer
from thresher.stores.runs import tracked_run
from thresher.tracking import eval_metrics, numbers, tracked


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Bootstrap:
    """A bootstrap run as it goes: its config and lake, the rounds' state, its summary and
    tracker, and the base model's forgetting-check results."""

    cfg: BootstrapConfig
    lake: Lake
    lake_root: str
    state: Rounds
    summary: dict[str, Any]
    tracker: Any
    progress: bool = True
    base_checks: list[dict] = field(default_factory=list)

    def model(self, round_: int) -> str:
        """Model r's folder: the base model for round 0, else what round r-1 trained."""
        return model_path(self.lake, self.cfg.name, self.cfg.base_model, round_)


@dataclass
class Round:
    """One round as it goes: the model that samples it and what each step produced."""

    r: int
    source: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    curated: CurateSummary | None = None
    trained: TrainSummary | None = None
    evaluated: EvalSummary | None = None
    checks: list[dict] = field(default_factory=list)

    @property
    def restate(self) -> bool:
        return bool(self.notes.get("restated", False))

    def at(self, boot: Bootstrap, round_: int) -> GateAt:
        """Where this round's gates look."""
        return GateAt(boot.lake, boot.cfg, round_, self.curated, self.checks)


def refuse_early(boot: Bootstrap) -> None:
    """Refuse what would fail later, before model 0's evaluation samples anything: an
    adapter-only output, and a pipeline its gates refuse."""
    if boot.cfg.train.output == "adapter":
        raise ValueError(
            "bootstrap samples with each round's model: train.output must be merged or both"
        )
    pipeline_gates(boot.lake, boot.cfg)
    # what decides every round: held-out metrics under these verifiers only
    boot.summary["eval_verify"] = boot.cfg.eval_verify().model_dump()


def evaluate_base(boot: Bootstrap) -> None:
    """Evaluate the base model (model 0) on the held-out prompts and the forgetting checks
    and start the rounds' state with it."""
    cfg = boot.cfg
    base = eval_flow(cfg.eval_config(0, cfg.base_model), boot.lake_root, boot.progress)
    _say(f"model 0 (base): {base.line()}")
    boot.base_checks = forgetting_checks(boot, 0, cfg.base_model, None)
    boot.state.start(base, boot.base_checks)
    boot.tracker.metrics(eval_metrics(boot.state.evals[0]["metrics"]), 0)


def choose_model(boot: Bootstrap, rnd: Round) -> None:
    """The model that samples the round, saying so when it is not the newest."""
    state, r = boot.state, rnd.r
    rnd.source = state.sampling_model()
    if rnd.source != r:
        _say(
            f"round {r}: model {r} regressed (pass@1 {state.pass1[r]:.3f}, model "
            f"{rnd.source}'s {state.pass1[rnd.source]:.3f}): sampling with model {rnd.source}"
        )


def prepare_round(boot: Bootstrap, rnd: Round) -> None:
    """Whether the round restates answers outside the asked format (the sampling model's
    held-out format share under `format.min_compliance`), and its generated prompts (an
    environment, each task at its curriculum level)."""
    cfg, r = boot.cfg, rnd.r
    if cfg.format is not None:
        share = boot.state.overall(rnd.source, FORMAT_METRIC)
        rnd.notes["restated"] = cfg.restates(share)
        if rnd.restate:
            shown = "unmeasured" if share is None else f"{share:.3f}"
            _say(
                f"round {r}: model {rnd.source} answers in the asked format {shown} of the "
                f"time (< {cfg.format.min_compliance:g}): correct answers outside it are "
                "kept and restated in it"
            )
    if cfg.environment is not None:
        env, dataset = cfg.environment, cfg.prompts.dataset
        levels = generate_round(boot.lake, env, dataset, cfg.name, r, correctness_judges(cfg))
        held_out = held_out_levels(boot.lake, env, cfg.eval.prompts.dataset)
        for task, plan in levels.items():
            at = f", held-out level {held_out[task]}" if task in held_out else ""
            _say(
                f"round {r}: {task} level {plan['level']} (0-{plan['levels'] - 1}{at}) "
                f"({plan['why']}), {plan['generated']} prompts"
            )
        rnd.notes["levels"] = {t: p["level"] for t, p in levels.items()}
        rnd.notes["held_out_levels"] = held_out


def correctness_judges(cfg: BootstrapConfig) -> dict[str, str]:
    """verifier -> options digest of the verdicts that say a round's answer is right: its
    verifiers but the asked format's (what the curriculum moves on)."""
    formats = cfg.verify.in_role("asked_format")
    digests = digests_of(cfg.verify, cfg.sampling.k, cfg.difficulty)
    return {n: d for n, d in digests.items() if n not in formats} or digests


def curate(boot: Bootstrap, rnd: Round) -> None:
    """Curate the round's prompts with its sampling model."""
    cfg = boot.cfg.curate_config(rnd.r, boot.model(rnd.source), rnd.restate)
    rnd.curated = curate_flow(cfg, boot.lake_root, boot.progress)
    _say(rnd.curated.line(rnd.r))


def restates_training(cfg: BootstrapConfig, earlier: list[dict], restate: bool) -> bool:
    """Whether a round's training restates answers outside the asked format: the round
    restates, or it replays (`train.all_rounds`) an earlier round's that did."""
    return restate or (cfg.train.all_rounds and any(r.get("restated") for r in earlier))


def gate_training(boot: Bootstrap, rnd: Round) -> None:
    """The gates the round's data must pass before it is trained on (audit, monitors)."""
    for gate in BEFORE_TRAINING:
        gate(rnd.at(boot, rnd.r))


def train(boot: Bootstrap, rnd: Round) -> None:
    """Train model r+1 on the kept data (the engine stops first: training wants the
    device, its memory and the cores)."""
    stop_engine()
    cfg = boot.cfg.train_config(rnd.r, restates_training(boot.cfg, boot.state.rounds, rnd.restate))
    rnd.trained = train_flow(cfg, boot.lake_root, boot.progress)
    if rnd.trained.already_trained:
        _say(f"round {rnd.r}: model {rnd.r + 1} already trained ({rnd.trained.model_dir})")


def evaluate(boot: Bootstrap, rnd: Round) -> None:
    """Evaluate model r+1 on the held-out prompts and the forgetting checks."""
    model = str(rnd.trained.model_dir)
    cfg = boot.cfg.eval_config(rnd.r + 1, model)
    rnd.evaluated = eval_flow(cfg, boot.lake_root, boot.progress)
    rnd.checks = forgetting_checks(boot, rnd.r + 1, model, boot.base_checks)


def record(boot: Bootstrap, rnd: Round) -> None:
    """The round in the rounds' state, the tracker, the best pointer and the summary."""
    state, r = boot.state, rnd.r
    gain = state.record(rnd.source, rnd.curated, rnd.trained, rnd.evaluated, rnd.checks,
                        rnd.notes)  # fmt: skip
    _say(f"model {r + 1}: {rnd.evaluated.line()} (gain {gain:+.3f})")
    # round r's data (step r) trained model r + 1 (its evaluation: step r + 1)
    boot.tracker.metrics(
        numbers(rnd.curated.model_dump(), "curate/")
        | numbers(rnd.curated.monitors or {}, "monitor/")
        | numbers(rnd.trained.model_dump(), "train/"),
        r,
    )
    boot.tracker.metrics(eval_metrics(rnd.evaluated.metric_rows()) | {"gain": gain}, r + 1)
    # kept current every round, so a run a gate stops still points at its best
    best = state.best_round
    set_best_pointer(boot.lake, boot.cfg.name, best, boot.model(best))
    boot.summary.update(state.summary())


def gate_evaluation(boot: Bootstrap, rnd: Round) -> None:
    """The gates model r+1 must pass after its evaluation (forgetting checks)."""
    for gate in AFTER_EVALUATION:
        gate(rnd.at(boot, rnd.r + 1))


def report_best(boot: Bootstrap) -> None:
    """The best model and why the run stopped, in the summary, the log and an artifact."""
    state, cfg = boot.state, boot.cfg
    best_model = boot.model(state.best_round)
    boot.summary.update(run_id=bootstrap_run_id(cfg), best_model=best_model, **state.summary())
    _say(f"best model: round {state.best_round} (pass@1 {state.best:.3f}), {best_model}")
    _say(f"stopped: {state.stopped}")
    publish(
        f"bootstrap-{cfg.name}",
        f"bootstrap {cfg.name}: {state.stopped}",
        round_table(boot.lake, cfg.name).to_dicts(),
        "Round r's pass@k is model r (round 0: the base model).",
    )


def track_report(boot: Bootstrap) -> None:
    """The report's page and plots attached to the bootstrap's tracked run."""
    if boot.cfg.tracking is None:
        return
    with tempfile.TemporaryDirectory() as out:
        page = write_report(boot.lake, out, boot.cfg.name)
        boot.tracker.artifacts([page, *sorted(Path(out).glob("*.png"))])


START_STEPS: tuple[Callable[[Bootstrap], None], ...] = (refuse_early, evaluate_base)
ROUND_STEPS: tuple[Callable[[Bootstrap, Round], None], ...] = (
    choose_model,
    prepare_round,
    curate,
    gate_training,
    train,
    evaluate,
    record,
    gate_evaluation,
)
END_STEPS: tuple[Callable[[Bootstrap], None], ...] = (report_best, track_report)


def bootstrap_run_name() -> str:
    """e.g. 'bootstrap demo word-problems'."""
    c = flow_run.parameters.get("config") or {}
    if not isinstance(c, dict):
        c = c.model_dump(include={"name", "prompts"})
    return f"bootstrap {c.get('name', '?')} {(c.get('prompts') or {}).get('dataset', '?')}"


@flow(name="bootstrap", flow_run_name=bootstrap_run_name)
@resolved
def bootstrap_flow(
    config: BootstrapConfig, lake_root: str, progress: bool = True
) -> BootstrapSummary:
    """Curate with model r, train model r+1, evaluate it; stop at max_rounds or when
    held-out pass@1 stops improving by min_gain for `patience` rounds. A gate that stops
    the run ends it Failed with the gate's reason, without a traceback."""
    cfg = config
    tolerance = cfg.rollback.tolerance if cfg.rollback.enabled else None
    state = Rounds(cfg.max_rounds, cfg.min_gain, cfg.patience, tolerance)
    run = dict(flow="bootstrap", round_=0, model=cfg.base_model, config=cfg.model_dump())
    lake = Lake(lake_root)
    try:
        with (
            deployment_cleanup(),
            tracked_run(lake, bootstrap_run_id(cfg), **run) as summary,
            tracked(cfg.tracking, cfg.name, "bootstrap", lake_root, run["config"]) as tracker,
        ):
            boot = Bootstrap(cfg, lake, lake_root, state, summary, tracker, progress)
            for start in START_STEPS:
                start(boot)
            while (r := state.next_round()) is not None:
                rnd = Round(r)
                for step in ROUND_STEPS:
                    step(boot, rnd)
            for end in END_STEPS:
                end(boot)
    except GateFailed as e:
        return Failed(message=str(e), data=e)
    return BootstrapSummary.model_validate(summary)


def forgetting_checks(
    boot: Bootstrap, round_: int, model: str, base: list[dict] | None
) -> list[dict]:
    """Evaluate model `round_` on every forgetting check (eval.also): per check its label,
    pass@1, the base model's pass@1 (`base`: model 0's results) and the drop."""
    cfg, out = boot.cfg, []
    for i, check in enumerate(cfg.eval.also):
        ran = eval_flow(cfg.forgetting_eval_config(i, round_, model), boot.lake_root,
                        boot.progress)  # fmt: skip
        pass1 = ran.overall()
        base_pass1 = base[i]["pass@1"] if base else pass1
        out.append(
            {
                "check": check.label(),
                "pass@1": pass1,
                "base_pass@1": base_pass1,
                "drop": round(base_pass1 - pass1, 4),
                "max_drop": check.max_drop,
            }
        )
        _say(
            f"model {round_} on {check.label()}: pass@1 {pass1:.3f}"
            + (f" (base {base_pass1:.3f}, gain {pass1 - base_pass1:+.3f})" if base else "")
        )
    return out


def run_bootstrap(
    cfg: BootstrapConfig, lake_root: str | Path, progress: bool = True
) -> dict[str, Any]:
    """Run the bootstrap flow for a validated config, then stop the engine it started;
    returns the run's summary as recorded."""
    return run_in_process(bootstrap_flow, cfg, lake_root, progress, subflows=True)
