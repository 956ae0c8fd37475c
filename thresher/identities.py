"""What identifies each stage's output: exactly the fields that determine it, nothing else.

Every identity is computed here, from config fields chosen by one rule (thresher.config.base):
a field marked `never` counts in no identity, `skipped_by(...)` leaves it out of the named
ones, a field a class had when its identities were first computed (`counted_at_default`)
always counts, and any field added since counts only while it is set to something other
than its default. So adding a defaulted field changes no identity of an existing lake.

A candidate's id is its prompt, model, round, sample index and sampling parameters; a
verdict's, its candidate, verifier and that verifier's options digest; a selection's,
everything selection depends on; an evaluation's, the model, prompts, n, k's and verifiers;
a training run's, its settings and a digest of its exact rows. A changed setting changes
the identity of the stages it touches, so only they run again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from thresher.config.base import COUNTED_WITH, EVERY, IDENTITY_SKIP
from thresher.ids import content_id

if TYPE_CHECKING:
    from thresher.config import BootstrapConfig, CurateConfig, EvalConfig, TrainConfig

# the identities fields may be left out of (skipped_by)
KINDS = ("curate", "selection", "candidate", "verdicts", "eval", "train", "bootstrap")


def fields_of(model: BaseModel, kind: str) -> dict[str, Any]:
    """The fields of `model` (its sections' too) that count in identity `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown identity {kind!r}; known: {', '.join(KINDS)}")
    cls = type(model)
    always: set[str] = set()
    for klass in cls.__mro__:
        always |= set(vars(klass).get("counted_at_default", ()))
    fields = cls.model_fields

    def is_set(name: str) -> bool:
        return getattr(model, name) != fields[name].get_default(call_default_factory=True)

    out = {}
    for name, info in fields.items():
        extra = info.json_schema_extra or {}
        skip = extra.get(IDENTITY_SKIP, ())
        if EVERY in skip or kind in skip:
            continue
        partner = extra.get(COUNTED_WITH)
        if name in always or is_set(name) or (partner is not None and is_set(partner)):
            out[name] = _plain(getattr(model, name), kind)
    return out


def _plain(value: Any, kind: str) -> Any:
    if isinstance(value, BaseModel):
        return fields_of(value, kind)
    if isinstance(value, list | tuple):
        return [_plain(v, kind) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, kind) for k, v in value.items()}
    return value


def sampling_params(cfg: Any) -> dict[str, Any]:
    """The parameters that make a candidate what it is (k is not: raising k tops up)."""
    return fields_of(cfg.sampling, "candidate")


def verifier_digests(cfg: CurateConfig) -> dict[str, str]:
    """verifier -> the digest of its version and options: which verdicts a run reads.

    A verifier that judges a prompt's candidates together (`majority`) also has what
    decides how many a prompt has (k, difficulty): with a larger k every candidate of the
    prompt is judged again among all of them, so old and new verdicts cannot disagree."""
    from thresher.verifiers import options_digest, traits

    digests = {}
    for name in cfg.verify.all_names():
        digest = options_digest(name, cfg.verify.options.get(name))
        if traits(name)["groups"]:
            group = {"k": cfg.sampling.k, "difficulty": fields_of(cfg.difficulty, "verdicts")}
            digest = content_id("group-verdicts", digest, group)
        digests[name] = digest
    return digests


def run_id_for(cfg: CurateConfig) -> str:
    """Same pipeline settings, same run: re-running resumes it."""
    return content_id("curate", fields_of(cfg, "curate"))


def selection_id_for(cfg: CurateConfig) -> str:
    """Everything a selection depends on: its candidates (prompts, model, round, sampling,
    difficulty, rationalization), the verdicts it reads and the select settings."""
    verify = cfg.verify
    return content_id(
        "selection",
        cfg.name,
        cfg.model_id,
        cfg.round,
        fields_of(cfg.prompts, "selection"),
        fields_of(cfg.sampling, "selection"),
        fields_of(cfg.difficulty, "selection"),
        fields_of(cfg.rationalize, "selection"),
        fields_of(cfg.select, "selection"),
        {"verifiers": verify.verifiers, "by_task": verify.by_task, "rule": verify.rule},
        verifier_digests(cfg),
    )


def eval_run_id(cfg: EvalConfig) -> str:
    """What determines the metrics: the model, the prompts, how they are sampled (n), the
    verifiers with their options and rule, the k's (and the pipeline name, for reports)."""
    cur = cfg.as_curate()
    return content_id(
        "evaluate",
        cfg.name,
        cur.model_id,
        cfg.round,
        fields_of(cfg.prompts, "eval"),
        cfg.n,
        sorted(cfg.ks),
        sampling_params(cur),
        {"verifiers": cfg.verify.verifiers, "by_task": cfg.verify.by_task},
        cfg.verify.rule,
        verifier_digests(cur),
    )


def rows_digest(rows: list[dict]) -> str:
    """A digest of the exact training rows, in order."""
    return content_id("rows", rows)


def train_run_id(cfg: TrainConfig, rows: list[dict]) -> str:
    """Same training settings and the same rows, same run: re-running resumes (or skips)
    it; new data (more prompts curated, another selection) is a new run."""
    return content_id("train", fields_of(cfg, "train"), rows_digest(rows))


def bootstrap_run_id(cfg: BootstrapConfig) -> str:
    """The rounds' settings; the stop rules and the gates (audit, monitors, forgetting
    checks) are not part of the run: raising max_rounds continues it, and a round stopped at
    a gate resumes once it passes."""
    return content_id("bootstrap", fields_of(cfg, "bootstrap"))


def comparable_settings(cfg: CurateConfig | dict[str, Any]) -> dict[str, Any]:
    """A curate run's settings as a report of what changed compares them: those that count
    in its identity (a stored config that no longer validates, as it was stored)."""
    if isinstance(cfg, dict):
        from pydantic import ValidationError

        from thresher.config import CurateConfig

        try:
            cfg = CurateConfig.model_validate(cfg, context={"open_test": True})
        except ValidationError:
            return cfg
    return fields_of(cfg, "curate")
