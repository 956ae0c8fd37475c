"""Prompts from procedural environments (reasoning-gym): each generated entry becomes a prompt
whose meta keeps the whole entry, the generator, its config and seed, so that the task's own
scorer can judge answers later (the `reasoning_gym` verifier)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from thresher.config.env import SEED_STRIDE, CurriculumConfig, EnvironmentConfig, round_dataset
from thresher.ids import content_id
from thresher.ingest.load import IngestError, IngestReport, RawRow, ingest_rows
from thresher.stores.lake import Lake
from thresher.stores.queries import (
    env_levels,
    eval_task_configs,
    held_out_questions,
    task_level_rates,
)

ENVIRONMENTS = ("reasoning-gym",)
PROBE_SEED = 50_021  # a round's probe prompts come from seeds after its own seed + this
INSTRUCTION = "Give only the final answer between <answer> and </answer> tags."
MISSING = (
    "reasoning-gym is not installed: pip install 'thresher[envs]' "
    "(or pip install reasoning-gym==0.1.25; one of its dependencies, pycosat, needs a C compiler)"
)


class TaskSpec(BaseModel):
    """One generator of the mixture: its weight and config (reasoning-gym's own fields)."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, gt=0, description="share of a mixture (with `mixture: true`)")
    config: dict[str, Any] = Field(default_factory=dict)


class EnvSpec(BaseModel):
    """What to generate: tasks, entries per task (or in all, for a mixture), seed, wording."""

    model_config = ConfigDict(extra="forbid")
    tasks: dict[str, TaskSpec] = Field(min_length=1)
    size: int = Field(100, ge=1, description="entries per task; with mixture: in all")
    seed: int = 0
    mixture: bool = Field(
        False, description="one weighted mixture of `size` entries (reasoning-gym's composite)"
    )
    instruction: str = Field(INSTRUCTION, description="appended to every question")


def parse_spec(
    what: str,
    size: int | None = None,
    seed: int | None = None,
    settings: list[str] | None = None,
    instruction: str | None = None,
) -> EnvSpec:
    """An EnvSpec from `TASK[,TASK...]` or a YAML file, with command-line values on top
    (`settings`: task.key=value, the value read as YAML)."""
    path = Path(what)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise IngestError(f"{path}: no such file")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise IngestError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise IngestError(f"{path}: expected a mapping with tasks, size, seed")
    else:
        names = [t.strip() for t in what.split(",") if t.strip()]
        if not names:
            raise IngestError("name at least one task, e.g. chain_sum,leg_counting")
        data = {"tasks": {name: {} for name in names}}
    tasks = data.get("tasks")
    if isinstance(tasks, list):  # a list of names, or of {name, weight, config}
        data["tasks"] = {
            (t if isinstance(t, str) else t.get("name")): ({} if isinstance(t, str) else t)
            for t in tasks
        }
        for spec in data["tasks"].values():
            spec.pop("name", None)
    for key, value in (("size", size), ("seed", seed), ("instruction", instruction)):
        if value is not None:
            data[key] = value
    for item in settings or []:
        name, _, value = item.partition("=")
        task, _, key = name.partition(".")
        if not (task and key and _):
            raise IngestError(f"--set {item!r}: write task.key=value, e.g. chain_sum.max_terms=3")
        if task not in (data.get("tasks") or {}):
            raise IngestError(f"--set {item!r}: {task} is not one of the tasks")
        data["tasks"][task].setdefault("config", {})[key] = yaml.safe_load(value)
    try:
        return EnvSpec.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise IngestError(f"bad reasoning-gym spec: {problems}") from None


def _import():
    try:
        import reasoning_gym
    except ImportError:
        raise IngestError(MISSING) from None
    return reasoning_gym


def json_safe(value: Any) -> Any:
    """The value as JSON can carry it: tuples and sets as lists, numpy scalars as numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=repr)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy scalars
        return json_safe(value.item())
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    return str(value)


def generate(spec: EnvSpec) -> Iterator[dict]:
    """Prompt records for every entry the spec asks for, in a fixed order."""
    rg = _import()
    from reasoning_gym.factory import DATASETS

    unknown = sorted(set(spec.tasks) - set(DATASETS))
    if unknown:
        raise IngestError(
            f"unknown reasoning-gym task(s) {unknown}; there are {len(DATASETS)}, e.g. "
            f"{', '.join(sorted(DATASETS)[:8])} ... (python -c 'import reasoning_gym.factory as f;"
            " print(sorted(f.DATASETS))')"
        )
    if spec.mixture:
        from reasoning_gym.composite import DatasetSpec

        parts = [
            DatasetSpec(name=n, weight=t.weight, config=t.config) for n, t in spec.tasks.items()
        ]
        datasets = [("composite", _create(rg, "composite", spec, datasets=parts))]
    else:
        datasets = [(n, _create(rg, n, spec, **t.config)) for n, t in spec.tasks.items()]
    for name, ds in datasets:
        for index in range(len(ds)):
            entry = ds[index]
            source = name
            if name == "composite":
                source = entry["metadata"].get("source_dataset", name)
            yield {
                "prompt": f"{entry['question']}\n\n{spec.instruction}".strip(),
                "task": source,
                "answer": None if entry.get("answer") is None else str(entry["answer"]),
                "meta": {
                    "env": "reasoning-gym",
                    "generator": source,
                    "config": json_safe(spec.tasks[source].config),
                    "seed": spec.seed,
                    "index": index,
                    **({"mixture": True} if name == "composite" else {}),
                    "entry": json_safe(entry),
                },
            }


def _create(rg, name: str, spec: EnvSpec, **config: Any):
    try:
        return rg.create_dataset(name, size=spec.size, seed=spec.seed, **config)
    except (TypeError, ValueError, AssertionError, KeyError) as e:
        raise IngestError(f"reasoning-gym {name}: bad config {config}: {e}") from None


def describe(spec: EnvSpec) -> str:
    """The ingest source string: environment, tasks, size, seed and a digest of the tasks'
    weights and configs (each row's meta has its config in full). Short and free of quotes,
    so that it can be pasted into a shell's SQL."""
    settings = content_id("env", {n: t.model_dump() for n, t in spec.tasks.items()})[:8]
    mixture = " mixture" if spec.mixture else ""
    return (
        f"reasoning-gym:{','.join(spec.tasks)} size={spec.size} seed={spec.seed}{mixture} "
        f"settings={settings}"
    )


def ingest_env(
    lake: Lake, env: str, spec: EnvSpec, dataset: str, split: str = "train"
) -> IngestReport:
    """Generate the spec's entries and ingest them as prompts (bad ones go to `rejects`)."""
    if env not in ENVIRONMENTS:
        raise IngestError(f"--from must be one of {', '.join(ENVIRONMENTS)}, got {env!r}")
    rows = (
        RawRow(line=i, raw=json.dumps(record, ensure_ascii=False, default=str), record=record)
        for i, record in enumerate(generate(spec), start=1)
    )
    return ingest_rows(lake, rows, describe(spec), dataset, split)


def round_levels(
    lake: Lake,
    env: EnvironmentConfig,
    dataset: str,
    round_: int,
    rates: dict[tuple[str, int | None], tuple[int, int]],
) -> dict[str, dict[str, Any]]:
    """Each task's level for round `round_`, and why: its start in round 0 (or without a
    curriculum); else the last round's level, one easier when the student's own answers
    there were right (`rates`: (task, level) -> (right, sampled)) less often than the band,
    one harder above it or (with a probe) when it solved the probe of the next level at
    the band's low rate."""
    plans: dict[str, dict[str, Any]] = {}
    before = env_levels(lake, round_dataset(dataset, round_ - 1)) if round_ > 0 else {}
    curriculum = env.curriculum
    for task, spec in env.tasks.items():
        was = before.get(task, spec.start)
        level, why = was, "start"
        passed, n = rates.get((task, was), (0, 0))
        if curriculum and n:
            level, why = _next_level(was, passed / n, rates.get((task, was + 1)), curriculum)
            why = f"right {passed / n:.3f} in round {round_ - 1} " + why
            if not 0 <= level < len(spec.levels):
                edge = "hardest level: out of levels" if level > was else "easiest level"
                level, why = was, f"{why}, but it is at its {edge}"
        elif round_ > 0:
            why = "no curriculum" if not curriculum else "not sampled last round"
        plans[task] = {"level": level, "levels": len(spec.levels), "why": why}
    return plans


def _next_level(
    level: int, rate: float, probe: tuple[int, int] | None, band: CurriculumConfig
) -> tuple[int, str]:
    """The level after one at `level` whose answers were right at `rate` (and the next
    level's probe (passed, n)), and why."""
    if rate < band.low:
        return level - 1, f"< {band.low:g}: easier"
    if rate > band.high:
        return level + 1, f"> {band.high:g}: harder"
    if probe and probe[1] and probe[0] / probe[1] >= band.low:
        ready = probe[0] / probe[1]
        return level + 1, f"in the band, probe of level {level + 1} right {ready:.3f}: harder"
    return level, f"in the band [{band.low:g}, {band.high:g}]: same level"


def held_out_levels(lake: Lake, env: EnvironmentConfig, dataset: str) -> dict[str, int]:
    """task -> the curriculum level whose settings the held-out `dataset` was generated at
    (tasks at none of the levels left out)."""
    found = {}
    for task, config in eval_task_configs(lake, dataset).items():
        spec = env.tasks.get(task)
        for i, level in enumerate(spec.levels if spec else []):
            if all(config.get(k) == v for k, v in level.items()):
                found[task] = i
                break
    return found


def generate_round(
    lake: Lake,
    env: EnvironmentConfig,
    dataset: str,
    pipeline: str,
    round_: int,
    judges: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Generate and ingest round `round_`'s training prompts into its own dataset: per
    task `per_round` distinct entries at the task's level, from the round's own seeds,
    none equal to an eval or test prompt; returns per task its level, why, and counts.
    A level moves on how often the student's own answers of pipeline `pipeline`'s last
    round were right: what the `judges` (verifier -> options digest) say, without them
    the round's rule. Generating a round again ingests nothing new."""
    moving = env.curriculum is not None and round_ > 0
    rates = task_level_rates(lake, pipeline, round_ - 1, judges) if moving else {}
    plans = round_levels(lake, env, dataset, round_, rates)
    held_out = held_out_questions(lake)
    seed = env.seed + round_ * SEED_STRIDE
    instruction = env.instruction if env.instruction is not None else INSTRUCTION
    records: list[dict] = []
    probe = env.curriculum.probe if env.curriculum else 0
    for task, plan in plans.items():
        levels = env.tasks[task].levels
        seen: set[str] = set()
        clashes = 0
        wanted = [(plan["level"], env.per_round, seed, {})]
        if probe and plan["level"] + 1 < len(levels):
            wanted.append((plan["level"] + 1, probe, seed + PROBE_SEED, {"probe": True}))
        for level, size, at, mark in wanted:
            spec = EnvSpec(
                tasks={task: TaskSpec(config=levels[level])},
                size=size * 2,  # room for repeats and held-out questions
                seed=at,
                instruction=instruction,
            )
            made = 0
            for record in generate(spec):
                key = " ".join(record["prompt"].split()).lower()
                question = " ".join(str(record["meta"]["entry"]["question"]).split()).lower()
                if key in held_out or question in held_out:
                    clashes += 1
                    continue
                if key in seen:
                    continue
                seen.add(key)
                record["meta"] |= {"level": level, "round": round_, **mark}
                records.append(record)
                made += 1
                if made == size:
                    break
        plan |= {"generated": len(seen), "held_out_clashes": clashes, "seed": seed}
    rows = (
        RawRow(line=i, raw=json.dumps(r, ensure_ascii=False, default=str), record=r)
        for i, r in enumerate(records, start=1)
    )
    source = f"reasoning-gym round {round_} seed={seed} levels=" + ",".join(
        f"{t}:{p['level']}" for t, p in plans.items()
    )
    ingest_rows(lake, rows, source, round_dataset(dataset, round_), "train")
    return plans
