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
from thresher.flows.identities import bootstrap_run_id
from thresher.stores.lake import Lake


def model_path(lake: Lake, cfg: BootstrapConfig, round_: int) -> str:
    """Model r's folder: the base model for round 0, else what round r-1 trained."""
    from thresher.flows.train import model_dir_for

    if round_ == 0:
        return cfg.base_model
    return str(model_dir_for(lake, cfg.name, round_) / "model")


def sampling_model_round(pass1: list[float], best_round: int, tolerance: float | None) -> int:
    """Which model samples the next round: the newest (the last of `pass1`, held-out
    pass@1 of models 0..r), or the best so far when the newest fell below it by more than
    `tolerance` (None: never roll back)."""
    newest = len(pass1) - 1
    if tolerance is not None and pass1[newest] < pass1[best_round] - tolerance:
        return best_round
    return newest


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pass1(metrics: list[dict]) -> float:
    for m in metrics:
        if m["task"] == "all" and m["metric"] == "pass@1":
            return m["value"]
    raise ValueError(f"the evaluation measured no overall pass@1 (metrics: {metrics})")


def _metrics_line(metrics: list[dict]) -> str:
    return ", ".join(f"{m['metric']} {m['value']:.3f}" for m in metrics if m["task"] == "all")


def bootstrap_run_name() -> str:
    """e.g. 'bootstrap demo word-problems'."""
    from prefect.runtime import flow_run

    c = flow_run.parameters.get("config", {})
    return f"bootstrap {c.get('name', '?')} {(c.get('prompts') or {}).get('dataset', '?')}"


@flow(name="bootstrap", flow_run_name=bootstrap_run_name)
def bootstrap_flow(config: dict[str, Any], lake_root: str, progress: bool = True) -> dict[str, Any]:
    """Curate with model r, train model r+1, evaluate it; stop at max_rounds or when
    held-out pass@1 stops improving by min_gain for `patience` rounds."""
    from thresher.flows.curate import curate_flow, deployment_cleanup, stop_engine
    from thresher.flows.evaluate import eval_flow
    from thresher.flows.gates import reward_model_check
    from thresher.flows.train import train_flow
    from thresher.stores.runs import tracked_run

    cfg = BootstrapConfig(**config)
    lake = Lake(lake_root)
    run_id = bootstrap_run_id(cfg)
    run = dict(flow="bootstrap", round_=0, model=cfg.base_model, config=config)
    try:
        with deployment_cleanup(), tracked_run(lake, run_id, **run) as summary:
            if cfg.train.output == "adapter":
                raise ValueError(
                    "bootstrap samples with each round's model: train.output must be merged or both"
                )
            # each round's curate checks its reward model; checking here refuses before model 0's
            # evaluation samples anything
            reward_model_check(lake, cfg.curate_config(0, cfg.base_model))
            rounds: list[dict[str, Any]] = []
            # what decides every round: held-out metrics under these verifiers only
            summary["eval_verify"] = cfg.eval_verify().model_dump()
            first = eval_flow(cfg.eval_config(0, cfg.base_model).model_dump(), lake_root, progress)
            best = _pass1(first["metrics"])
            pass1s, best_round = [best], 0
            tolerance = cfg.rollback.tolerance if cfg.rollback.enabled else None
            _say(f"model 0 (base): {_metrics_line(first['metrics'])}")
            history = [{"round": 0, "metrics": first["metrics"]}]
            base_also = forgetting_checks(cfg, lake_root, 0, cfg.base_model, None, progress)
            if base_also:
                history[0]["also"] = base_also
            stale, stop = 0, f"max_rounds ({cfg.max_rounds}) reached"
            for r in range(cfg.max_rounds):
                source = sampling_model_round(pass1s, best_round, tolerance)
                if source != r:
                    _say(
                        f"round {r}: model {r} regressed (pass@1 {pass1s[r]:.3f}, model "
                        f"{source}'s {pass1s[source]:.3f}): sampling with model {source}"
                    )
                model = model_path(lake, cfg, source)
                curated = curate_flow(cfg.curate_config(r, model).model_dump(), lake_root, progress)
                _say(
                    f"round {r}: {curated['prompts']} prompts sampled "
                    f"({curated['skipped_solved']} skipped as solved"
                    + (f", {curated['retired']} retired" if curated.get("retired") else "")
                    + "), "
                    f"{curated['candidates']} candidates, {curated['passed']} passed, "
                    f"kept {curated['kept']}"
                )
                if cfg.audit is not None:
                    audit_gate(lake, cfg, r)
                if cfg.monitors is not None:
                    monitors_gate(cfg, r, curated.get("monitors") or {})
                stop_engine()  # training wants the device, its memory and the cores
                trained = train_flow(cfg.train_config(r).model_dump(), lake_root, progress)
                if trained.get("already_trained"):
                    _say(f"round {r}: model {r + 1} already trained ({trained['model_dir']})")
                evaluated = eval_flow(
                    cfg.eval_config(r + 1, trained["model_dir"]).model_dump(), lake_root, progress
                )
                pass1 = _pass1(evaluated["metrics"])
                gain = pass1 - best
                _say(f"model {r + 1}: {_metrics_line(evaluated['metrics'])} (gain {gain:+.3f})")
                rounds.append(
                    {
                        "round": r,
                        "sampled_with": source,
                        "curate": {
                            k: curated.get(k)
                            for k in (
                                "run_id",
                                "candidates",
                                "passed",
                                "kept",
                                "sampled_now",
                                "skipped_solved",
                                "retired",
                                "band",
                            )
                        },
                        "train": {
                            k: trained.get(k)
                            for k in ("run_id", "rows", "steps", "final_loss", "model_dir", "mix")
                            if k in trained
                        },
                        "monitors": curated.get("monitors"),
                    }
                )
                history.append({"round": r + 1, "metrics": evaluated["metrics"]})
                pass1s.append(pass1)
                if pass1 > best:
                    best, best_round = pass1, r + 1
                # kept current every round, so a run a gate stops still points at its best
                write_best_pointer(lake, cfg, best_round, model_path(lake, cfg, best_round))
                also = forgetting_checks(
                    cfg, lake_root, r + 1, trained["model_dir"], base_also, progress
                )
                if also:
                    history[-1]["also"] = also
                    summary.update(rounds=rounds, evals=history)  # kept if the gate stops
                    forgetting_gate(cfg, r + 1, also)
                stale = stale + 1 if gain < cfg.min_gain else 0
                if stale >= cfg.patience:
                    stop = f"pass@1 gained less than {cfg.min_gain} for {stale} round(s)"
                    break
            stop_engine()
            best_model = model_path(lake, cfg, best_round)
            write_best_pointer(lake, cfg, best_round, best_model)
            summary.update(
                run_id=run_id,
                rounds=rounds,
                evals=history,
                stopped=stop,
                best_round=best_round,
                best_model=best_model,
            )
            _say(f"best model: round {best_round} (pass@1 {best:.3f}), {best_model}")
            _say(f"stopped: {stop}")
            publish_bootstrap(cfg, lake, stop)
    except GateFailed as e:
        # an expected stop: the run ends Failed with the reason, without a traceback
        from prefect.states import Failed

        return Failed(message=str(e), data=e)
    return summary


def write_best_pointer(lake: Lake, cfg: BootstrapConfig, best_round: int, model: str) -> None:
    """<models>/<name>/best.json: which round's model is the best on held-out pass@1."""
    import json

    from thresher.flows.train import model_dir_for

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
    from thresher.flows.evaluate import eval_flow

    out = []
    for i, check in enumerate(cfg.eval.also):
        ran = eval_flow(
            cfg.forgetting_eval_config(i, round_, model).model_dump(), lake_root, progress
        )
        pass1 = _pass1(ran["metrics"])
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
    from thresher.flows.curate import quiet_task_logs, stop_engine
    from thresher.flows.runtime import flow_settings

    quiet_task_logs(flows=True)
    try:
        with flow_settings():
            return bootstrap_flow(cfg.model_dump(), str(lake_root), progress)
    finally:
        stop_engine()
