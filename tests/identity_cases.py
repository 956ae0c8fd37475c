"""The configs whose identities are pinned (tests/data/identity_pins.json): every bundled
config, and variants that set the fields which count only when set."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ROWS = [{"messages": [{"role": "user", "content": "1+1"}], "answer": "2"}]


def bundled() -> dict[str, tuple[str, dict]]:
    """name -> (kind, data) of every pipeline config in configs/."""
    out = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        kind = (
            "bootstrap"
            if "base_model" in data and "eval" in data
            else "train"
            if "base_model" in data
            else "curate"
        )
        out[path.stem] = (kind, data)
    return out


def variants() -> dict[str, tuple[str, dict]]:
    """Configs that set what the bundled ones leave at defaults."""
    demo = bundled()["demo"][1]
    boot = bundled()["bootstrap-demo"][1]
    train = bundled()["train-demo"][1]
    return {
        "curate-extras": (
            "curate",
            demo
            | {
                "select": {
                    "cap": 2,
                    "min_test_strength": 0.5,
                    "decontaminate": {"exact": True, "eval_datasets": ["x"]},
                    "max_pass_rate": 0.9,
                },
                "difficulty": {
                    "retire_after": 2,
                    "hard_below": 0.25,
                    "hard_k": 16,
                    "skip_solved_above": 1.0,
                    "min_pass_rate": 0.1,
                    "max_pass_rate": 0.9,
                },
                "rationalize": {"enabled": True, "k": 2},
                "verify": {
                    "verifiers": ["math", "format"],
                    "by_task": {"code": ["code"]},
                    "options": {"code": {"timeout_s": 3}, "format": {"pattern": "x"}},
                    "rule": "math and format",
                },
                "lora": "some/adapter",
                "sampling": {"k": 4, "stop": ["</answer>"], "top_k": 5},
            },
        ),
        "bootstrap-extras": (
            "bootstrap",
            boot
            | {
                "train": {
                    "mix": [{"pipeline": "self", "weight": 2}, {"dataset": "gen", "weight": 1}],
                    "mix_rows": 100,
                    "packing": False,
                    "early_stopping": {"patience": 2},
                },
                "eval": boot["eval"]
                | {"also": [{"dataset": "general", "max_drop": 0.05}], "temperature": 0.5},
                "audit": {"max_false_pass": 0.1},
                "monitors": {"min_distinct_answers": 1.5},
                "difficulty": {"retire_after": 3},
                "select": {"decontaminate": {"exact": True}},
            },
        ),
        "train-extras": (
            "train",
            train | {"mix": [{"pipeline": "self", "weight": 1}], "packing": False},
        ),
        "eval-plain": (
            "eval",
            {
                "name": "e",
                "model": "m",
                "prompts": {"dataset": "d", "split": "eval"},
                "n": 4,
                "ks": [1, 4],
                "sampling": {"temperature": 0.9},
            },
        ),
    }


def build(kind: str, data: dict):
    """The validated config of `kind` from `data`."""
    from thresher.config import BootstrapConfig, CurateConfig, EvalConfig, TrainConfig

    model = {
        "curate": CurateConfig,
        "train": TrainConfig,
        "eval": EvalConfig,
        "bootstrap": BootstrapConfig,
    }[kind]
    return model(**data)


def as_curate(cfg):
    """The curate config that samples and verifies what evaluation `cfg` does: its run and
    selection ids are pinned, and its candidates and verdicts are the evaluation's own."""
    from thresher.config import CurateConfig

    sampling = cfg.sampling.model_copy(update={"k": cfg.n})
    fields = dict(sampling=sampling, name=f"eval:{cfg.name}", model=cfg.model, lora=cfg.lora,
                  round=cfg.round, prompts=cfg.prompts, verify=cfg.verify)  # fmt: skip
    return CurateConfig.model_validate(cfg.runtime() | fields, context={"open_test": cfg.final})


def ids_of(kind: str, data: dict) -> dict[str, object]:
    """Every identity a config of `kind` determines, by name."""
    return ids_of_config(kind, build(kind, data))


def ids_of_config(kind: str, cfg) -> dict[str, object]:
    """Every identity config `cfg` (of `kind`) determines, by name."""
    from thresher import identities as ident
    from thresher.identities import candidate_id, sampling_params
    from thresher.plan import plan_eval

    def curate(cfg) -> dict[str, object]:
        return {
            "run": ident.run_id_for(cfg),
            "selection": ident.selection_id_for(cfg),
            "verdicts": ident.verifier_digests(cfg),
            "candidate": candidate_id("p0", cfg.model_id, cfg.round, 0, sampling_params(cfg)),
        }

    def sampled(cfg) -> dict[str, object]:
        """An evaluation's candidates and verdicts, from its own plan."""
        plan = plan_eval(cfg)
        first = candidate_id("p0", plan.model_id, plan.round, 0, plan.params)
        return {"verdicts": plan.digests, "candidate": first}

    if kind == "curate":
        return curate(cfg)
    if kind == "train":
        return {"train": ident.train_run_id(cfg, ROWS)}
    if kind == "eval":
        return {"eval": ident.eval_run_id(cfg), **curate(as_curate(cfg)), **sampled(cfg)}
    out: dict[str, object] = {"bootstrap": ident.bootstrap_run_id(cfg)}
    for r in (0, 1):
        model = cfg.base_model if r == 0 else f"models/round-{r}"
        for key, value in curate(cfg.curate_config(r, model)).items():
            out[f"round{r}.curate.{key}"] = value
        out[f"round{r}.train"] = ident.train_run_id(cfg.train_config(r), ROWS)
        ev = cfg.eval_config(r, model)
        out[f"round{r}.eval"] = ident.eval_run_id(ev)
        out[f"round{r}.eval.candidate"] = sampled(ev)["candidate"]
        for i in range(len(cfg.eval.also)):
            out[f"round{r}.also{i}"] = ident.eval_run_id(cfg.forgetting_eval_config(i, r, model))
    return out


def all_ids() -> dict[str, dict[str, object]]:
    """name -> its identities, for every pinned config."""
    return {name: ids_of(kind, data) for name, (kind, data) in (bundled() | variants()).items()}
