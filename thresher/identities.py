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

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from thresher.config import CurateConfig, DifficultyConfig
from thresher.config.base import COUNTED_WITH, EVERY, IDENTITY_SKIP
from thresher.ids import canonical_json, content_id

if TYPE_CHECKING:
    from thresher.config import BootstrapConfig, EvalConfig, TrainConfig, VerifyConfig

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
        value = getattr(model, name)
        default = fields[name].get_default(call_default_factory=True)
        if isinstance(value, BaseModel) and isinstance(default, BaseModel):
            # a section counts when what counts in it differs from its default's
            return fields_of(value, kind) != fields_of(default, kind)
        return value != default

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
    """verifier -> the digest of its version and options: which verdicts a curate run reads."""
    return digests_of(cfg.verify, cfg.sampling.k, cfg.difficulty)


def digests_of(
    verify: VerifyConfig, k: int, difficulty: DifficultyConfig | None = None
) -> dict[str, str]:
    """verifier -> the digest of its version and options, for prompts sampled k times.

    A verifier that judges a prompt's candidates together (`majority`) also has what
    decides how many a prompt has (k, difficulty): with a larger k every candidate of the
    prompt is judged again among all of them, so old and new verdicts cannot disagree."""
    from thresher.verifiers import options_digest, traits  # local: layering (see test_layers.py)

    difficulty = difficulty if difficulty is not None else DifficultyConfig()
    digests = {}
    for name in verify.all_names():
        digest = options_digest(name, verify.options.get(name))
        if traits(name)["groups"]:
            group = {"k": k, "difficulty": fields_of(difficulty, "verdicts")}
            digest = content_id("group-verdicts", digest, group)
        digests[name] = digest
    return digests


def run_id_for(cfg: CurateConfig) -> str:
    """Same pipeline settings, same run: re-running resumes it."""
    return content_id("curate", fields_of(cfg, "curate"))


def selection_id_for(cfg: CurateConfig) -> str:
    """Everything a selection depends on: its candidates (prompts, model, round, sampling,
    difficulty, rationalization, teachers, hints), the verdicts it reads and the select
    settings."""
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
        # sources added since selections had ids count only when set
        *([[fields_of(t, "selection") for t in cfg.teachers]] if cfg.teachers else []),
        *([fields_of(cfg.hints, "selection")] if cfg.hints.enabled else []),
    )


def eval_run_id(cfg: EvalConfig, opening: int | None = None) -> str:
    """What determines the metrics: the model, the prompts, how they are sampled (n), the
    verifiers with their options and rule, the k's (and the pipeline name, for reports).
    Each opening of the sealed test split (a final evaluation) is a run of its own."""
    run_id = content_id(
        "evaluate",
        cfg.name,
        cfg.model_id,
        cfg.round,
        fields_of(cfg.prompts, "eval"),
        cfg.n,
        sorted(cfg.ks),
        sampling_params(cfg),
        {"verifiers": cfg.verify.verifiers, "by_task": cfg.verify.by_task},
        cfg.verify.rule,
        digests_of(cfg.verify, cfg.n),
    )
    return run_id if opening is None else content_id(run_id, "test-opening", opening)


def candidate_id(
    prompt_id: str, model: str, round_: int, sample_idx: int, params: dict[str, Any]
) -> str:
    """The id of one candidate: same prompt, model, round, index and parameters, same id."""
    return content_id("candidate", prompt_id, model, round_, sample_idx, params)


def _id_parts(model: str, round_: int, params: dict[str, Any]) -> tuple[str, bytes]:
    """The JSON content_id hashes for a candidate, around its prompt id and index."""
    middle = f",{canonical_json(model)},{canonical_json(round_)},"
    return middle, f",{canonical_json(params)}]".encode()


def _hashed(prompt_id: str, middle: str, tail: bytes, indices: Iterable[int]) -> list[str]:
    head = f'["candidate",{canonical_json(prompt_id)}{middle}'.encode()
    return [
        hashlib.blake2b(head + str(int(i)).encode() + tail, digest_size=8).hexdigest()
        for i in indices
    ]


def candidate_ids(
    prompt_id: str, model: str, round_: int, indices: Iterable[int], params: dict[str, Any]
) -> list[str]:
    """`candidate_id` for many sample indices of one prompt, the JSON around the index
    written once (the same text content_id hashes, so the same ids)."""
    return _hashed(prompt_id, *_id_parts(model, round_, params), indices)


def expected_ids(
    prompt_ids: Sequence[str],
    model: str,
    round_: int,
    k: int | Mapping[str, int],
    params: dict[str, Any],
) -> list[str]:
    """Every candidate id a complete sampling of these prompts produces (`k` per prompt,
    or `k[prompt_id]`)."""
    middle, tail = _id_parts(model, round_, params)
    ids = []
    for p in prompt_ids:
        ids += _hashed(p, middle, tail, range(k if isinstance(k, int) else k[p]))
    return ids


def batch_id(run_id: str | None, prompt_ids: Sequence[str], hinted: bool = False) -> str:
    """The id of one batch's sampling (its candidates' `batch_id`): the run and its prompts
    (hinted: the batch's rationalization pass)."""
    return content_id("hinted-batch" if hinted else "batch", run_id, list(prompt_ids))


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

        try:
            cfg = CurateConfig.model_validate(cfg, context={"open_test": True})
        except ValidationError:
            return cfg
    return fields_of(cfg, "curate")
