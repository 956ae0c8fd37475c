"""The bootstrap flow: STaR / rejection-sampling fine-tuning, round after round.

Model 0 is the base model. Round r curates the training prompts with model r, trains
model r+1 on the kept data, and evaluates model r+1 on held-out prompts. Every step has
a content-derived run id, so re-running the same config skips what is finished and
resumes what is not; raising `max_rounds` adds rounds after the last one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prefect import flow

from thresher.config import BootstrapConfig
from thresher.flows import flow_object
from thresher.flows.rounds import Rounds
from thresher.flows.runtime import deployment_cleanup, run_in_process, stop_engine
from thresher.flows.summaries import CurateSummary, EvalSummary, TrainSummary
from thresher.identities import bootstrap_run_id
from thresher.stores.lake import Lake


def model_path(lake: Lake, cfg: BootstrapConfig, round_: int) -> str:
    """Model r's folder: the base model for round 0, else what round r-1 trained."""
    from thresher.flows.train import model_dir_for

    if round_ == 0:
        return cfg.base_model
    return str(model_dir_for(lake, cfg.name, round_) / "model")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bootstrap_run_name() -> str:
    """e.g. 'bootstrap demo word-problems'."""
    from prefect.runtime import flow_run

    c = flow_run.parameters.get("config") or {}
    if not isinstance(c, dict):
        c = c.model_dump(include={"name", "prompts"})
    return f"bootstrap {c.get('name', '?')} {(c.get('prompts') or {}).get('dataset', '?')}"


@flow(name="bootstrap", flow_run_name=bootstrap_run_name)
def bootstrap_flow(config: Any, lake_root: str, progress: bool = True) -> dict[str, Any]:
    """Curate with model r, train model r+1, evaluate it; stop at max_rounds or when
    held-out pass@1 stops improving by min_gain for `patience` rounds."""
    # a model from a command or a parent flow; a deployment's run passes the JSON it stores
    cfg = BootstrapConfig.model_validate(config)  # a model passes through as it is
    from thresher.stores.runs import tracked_run
    from thresher.tracking import eval_metrics, numbers, tracked

    lake = Lake(lake_root)
    run = dict(flow="bootstrap", round_=0, model=cfg.base_model, config=cfg.model_dump())
    tolerance = cfg.rollback.tolerance if cfg.rollback.enabled else None
    state = Rounds(cfg.max_rounds, cfg.min_gain, cfg.patience, tolerance)
    try:
        with (
            deployment_cleanup(),
            tracked_run(lake, bootstrap_run_id(cfg), **run) as summary,
            tracked(cfg.tracking, cfg.name, "bootstrap", lake_root, run["config"]) as tracker,
        ):
            before_round_zero(lake, cfg)
            # what decides every round: held-out metrics under these verifiers only
            summary["eval_verify"] = cfg.eval_verify().model_dump()
            base_also = evaluate_base(cfg, lake_root, state, progress)
            tracker.metrics(eval_metrics(state.evals[0]["metrics"]), 0)
            while (r := state.next_round()) is not None:
                source = sampling_model(state, r)
                notes = prepare_round(lake, cfg, state, r, source)
                restate = notes.get("restated", False)
                curated = CurateSummary.model_validate(
                    flow_object("curate")(
                        cfg.curate_config(r, model_path(lake, cfg, source), restate),
                        lake_root,
                        progress,
                    )
                )
                _say(curated.line(r))
                before_training(lake, cfg, r, curated)
                stop_engine()  # training wants the device, its memory and the cores
                trained = TrainSummary.model_validate(
                    flow_object("train")(cfg.train_config(r, restate), lake_root, progress)
                )
                if trained.already_trained:
                    _say(f"round {r}: model {r + 1} already trained ({trained.model_dir})")
                model = str(trained.model_dir)
                evaluated = EvalSummary.model_validate(
                    flow_object("evaluate")(cfg.eval_config(r + 1, model), lake_root, progress)
                )
                also = forgetting_checks(cfg, lake_root, r + 1, model, base_also, progress)
                gain = state.record(source, curated, trained, evaluated, also, notes)
                _say(f"model {r + 1}: {evaluated.line()} (gain {gain:+.3f})")
                # round r's data (step r) trained model r + 1 (its evaluation: step r + 1)
                tracker.metrics(
                    numbers(curated.model_dump(), "curate/")
                    | numbers(curated.monitors or {}, "monitor/")
                    | numbers(trained.model_dump(), "train/"),
                    r,
                )
                tracker.metrics(eval_metrics(evaluated.metric_rows()) | {"gain": gain}, r + 1)
                # kept current every round, so a run a gate stops still points at its best
                write_best_pointer(lake, cfg, state.best_round)
                summary.update(state.summary())
                forgetting_gate(cfg, r + 1, also)
            best_model = model_path(lake, cfg, state.best_round)
            summary.update(run_id=bootstrap_run_id(cfg), best_model=best_model, **state.summary())
            _say(f"best model: round {state.best_round} (pass@1 {state.best:.3f}), {best_model}")
            _say(f"stopped: {state.stopped}")
            publish_bootstrap(cfg, lake, state.stopped)
            if cfg.tracking is not None:
                track_report(tracker, lake, cfg.name)
    except GateFailed as e:
        # an expected stop: the run ends Failed with the reason, without a traceback
        from prefect.states import Failed

        return Failed(message=str(e), data=e)
    return summary


def track_report(tracker, lake: Lake, name: str) -> None:
    """The report's page and plots attached to the bootstrap's tracked run."""
    import tempfile
    from pathlib import Path

    from thresher.evaluators.page import write_report

    with tempfile.TemporaryDirectory() as out:
        page = write_report(lake, out, name)
        tracker.artifacts([page, *sorted(Path(out).glob("*.png"))])


def sampling_model(state: Rounds, round_: int) -> int:
    """The model that samples round `round_`, saying so when it is not the newest."""
    source = state.sampling_model()
    if source != round_:
        _say(
            f"round {round_}: model {round_} regressed (pass@1 {state.pass1[round_]:.3f}, "
            f"model {source}'s {state.pass1[source]:.3f}): sampling with model {source}"
        )
    return source


def prepare_round(
    lake: Lake, cfg: BootstrapConfig, state: Rounds, round_: int, source: int
) -> dict[str, Any]:
    """What round `round_` needs before it samples: its generated prompts (an environment,
    each task at its curriculum level) and whether it restates answers outside the asked
    format (the sampling model's held-out format share under `format.min_compliance`)."""
    notes: dict[str, Any] = {}
    if cfg.format is not None:
        share = state.overall(source, "format")
        notes["restated"] = cfg.restates(share)
        if notes["restated"]:
            shown = "unmeasured" if share is None else f"{share:.3f}"
            _say(
                f"round {round_}: model {source} answers in the asked format "
                f"{shown} of the time (< {cfg.format.min_compliance:g}): correct answers "
                "outside it are kept and restated in it"
            )
    if cfg.environment is not None:
        from thresher.ingest.envs import generate_round

        levels = generate_round(lake, cfg.environment, cfg.prompts.dataset, cfg.name, round_)
        for task, plan in levels.items():
            _say(
                f"round {round_}: {task} level {plan['level']} (0-{plan['levels'] - 1}) "
                f"({plan['why']}), {plan['generated']} prompts"
            )
        notes["levels"] = {t: p["level"] for t, p in levels.items()}
    return notes


def before_round_zero(lake: Lake, cfg: BootstrapConfig) -> None:
    """Refuse what would fail later, before model 0's evaluation samples anything: an
    adapter-only output, and a pipeline its gates refuse."""
    from thresher.flows.gates import pipeline_gates

    if cfg.train.output == "adapter":
        raise ValueError(
            "bootstrap samples with each round's model: train.output must be merged or both"
        )
    pipeline_gates(lake, cfg)


def evaluate_base(cfg: BootstrapConfig, lake_root: str, state: Rounds, progress: bool) -> list:
    """Evaluate the base model (model 0) on the held-out prompts and the forgetting checks
    and start the rounds' state with it; returns its forgetting-check results."""
    model = cfg.base_model
    base = EvalSummary.model_validate(
        flow_object("evaluate")(cfg.eval_config(0, model), lake_root, progress)
    )
    _say(f"model 0 (base): {base.line()}")
    also = forgetting_checks(cfg, lake_root, 0, model, None, progress)
    state.start(base, also)
    return also


def before_training(lake: Lake, cfg: BootstrapConfig, round_: int, curated: CurateSummary) -> None:
    """The gates a round's data must pass before it is trained on (audit, monitors)."""
    if cfg.audit is not None:
        audit_gate(lake, cfg, round_)
    if cfg.monitors is not None:
        monitors_gate(cfg, round_, curated.monitors or {})


def write_best_pointer(lake: Lake, cfg: BootstrapConfig, best_round: int) -> None:
    """<models>/<name>/best.json: which round's model is the best on held-out pass@1."""
    import json

    from thresher.flows.train import model_dir_for

    model = model_path(lake, cfg, best_round)
    folder = model_dir_for(lake, cfg.name, 0).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "best.json").write_text(json.dumps({"round": best_round, "model": model}) + "\n")


def read_best_pointer(lake: Lake, name: str) -> dict | None:
    """best.json of bootstrap `name` ({round, model}), or None when it has none."""
    import json

    from thresher.flows.train import model_dir_for

    path = model_dir_for(lake, name, 0).parent / "best.json"
    return json.loads(path.read_text()) if path.exists() else None


class GateFailed(ValueError):
    """A gate stopped the run: an expected stop, with its reason and figures."""


class AuditGateFailed(GateFailed):
    """A round's labelled false-pass rate is over the configured gate (or unmeasured)."""


class ForgettingGateFailed(GateFailed):
    """A round's model lost more than max_drop of pass@1 on a forgetting check."""


def forgetting_checks(
    cfg: BootstrapConfig,
    lake_root: str,
    round_: int,
    model: str,
    base: list[dict] | None,
    progress: bool,
) -> list[dict]:
    """Evaluate model `round_` on every forgetting check (eval.also): per check its label,
    pass@1, the base model's pass@1 (`base`: model 0's results) and the drop."""
    out = []
    for i, check in enumerate(cfg.eval.also):
        ran = flow_object("evaluate")(
            cfg.forgetting_eval_config(i, round_, model), lake_root, progress
        )
        pass1 = EvalSummary.model_validate(ran).overall()
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
            + (f" (base {base_pass1:.3f}, drop {base_pass1 - pass1:+.3f})" if base else "")
        )
    return out


def forgetting_gate(cfg: BootstrapConfig, round_: int, results: list[dict]) -> None:
    """Raise ForgettingGateFailed when model `round_` dropped below the base model on a
    forgetting check by more than its max_drop."""
    over = [r for r in results if r["max_drop"] is not None and r["drop"] > r["max_drop"] + 1e-9]
    if over:
        raise ForgettingGateFailed(
            f"{cfg.name} stopped at the forgetting check: "
            + "; ".join(
                f"model {round_} scores pass@1 {r['pass@1']:.3f} on {r['check']} against "
                f"the base model's {r['base_pass@1']:.3f}, a drop of {r['drop']:.3f} over "
                f"max_drop {r['max_drop']}"
                for r in over
            )
        )


class MonitorsGateFailed(GateFailed):
    """A round's monitors broke a threshold of the configured gate (config `monitors`)."""


def monitors_gate(cfg: BootstrapConfig, round_: int, monitors: dict[str, Any]) -> None:
    """Raise MonitorsGateFailed, with one line naming each broken threshold, unless the
    round's monitors hold the thresholds of config `monitors`."""
    from thresher.evaluators.monitors import check_monitors

    broken = check_monitors(monitors, cfg.monitors)
    if broken:
        raise MonitorsGateFailed(
            f"round {round_} of {cfg.name} stopped at the monitors gate before training: "
            + "; ".join(broken)
            + ". Look at the round (view round_monitors, `thresher report`), relax "
            "`monitors:` if the threshold is wrong, then run the bootstrap again: finished "
            "steps are reused"
        )


def audit_gate(lake: Lake, cfg: BootstrapConfig, round_: int) -> None:
    """Raise AuditGateFailed, after writing an audit sheet of the round, unless the round's
    labelled false-pass rate holds (config `audit`)."""
    from thresher.evaluators.audit import check_round
    from thresher.evaluators.audit_sheet import write_sheet

    gate = cfg.audit
    result = check_round(
        lake, cfg.name, round_, gate.max_false_pass, gate.min_labels, gate.verifiers
    )
    for line in result.lines:
        _say(f"round {round_} audit: {line}")
    if result.passed:
        return
    sheet = write_sheet(lake, round_, lake.local_dir("audits"), cfg.name, gate.sheet_size)
    raise AuditGateFailed(
        f"round {round_} of {cfg.name} stopped at the audit gate before training: "
        + "; ".join(result.lines)
        + f". Label {sheet.html} (or {sheet.csv}), run `thresher audit import FILE`, fix "
        "the verifier if it is wrong, then run the bootstrap again: finished steps are reused"
    )


def publish_bootstrap(cfg: BootstrapConfig, lake: Lake, stop: str) -> None:
    """Held-out pass@k and the funnel per round, as a Prefect artifact."""
    from thresher.evaluators.report import round_table
    from thresher.flows.artifacts import publish

    publish(
        f"bootstrap-{cfg.name}",
        f"bootstrap {cfg.name}: {stop}",
        round_table(lake, cfg.name).to_dicts(),
        "Round r's pass@k is model r (round 0: the base model).",
    )


def run_bootstrap(
    cfg: BootstrapConfig, lake_root: str | Path, progress: bool = True
) -> dict[str, Any]:
    """Run the bootstrap flow for a validated config, then stop the engine it started."""
    return run_in_process(bootstrap_flow, cfg, lake_root, progress, subflows=True)
