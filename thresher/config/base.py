"""What every config model shares: strict fields, how a field counts in identities, loading.

Identities (thresher.identities) are made from config fields by one rule:

- a field marked `never(...)` (where or how fast work runs, gates, stop rules, reporting
  thresholds, layout) counts in no identity; `skipped_by("train", ...)` leaves it out of
  the named identities only;
- a field listed in its class's `counted_at_default` counts always (these are the fields
  the class had when its identities were first computed);
- any other field counts only while it differs from its default, so a field added later
  with a default changes no existing identity until someone sets it; one added together
  with another (`counted_with`) counts whenever either is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

IDENTITY_SKIP = "identity_skip"  # json_schema_extra key: identities that leave a field out
COUNTED_WITH = "counted_with"  # json_schema_extra key: the field it was added together with
EVERY = "*"


def skipped_by(*identities: str, **field: Any) -> Any:
    """A pydantic Field that the named identities (curate, selection, candidate, verdicts,
    eval, train, bootstrap) leave out."""
    extra = dict(field.pop("json_schema_extra", None) or {})
    extra[IDENTITY_SKIP] = list(identities)
    return Field(json_schema_extra=extra, **field)


def counted_with(other: str, **field: Any) -> Any:
    """A pydantic Field added together with field `other`: it counts in identities whenever
    either of them is set."""
    extra = dict(field.pop("json_schema_extra", None) or {})
    extra[COUNTED_WITH] = other
    return Field(json_schema_extra=extra, **field)


def never(**field: Any) -> Any:
    """A pydantic Field that decides whether or how a stage runs, not what it makes: it
    counts in no identity."""
    return skipped_by(EVERY, **field)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # the fields that count in identities even at their default (see the module docstring)
    counted_at_default: ClassVar[frozenset[str]] = frozenset()


class TrackingConfig(_Strict):
    """Log each curate, train, eval and bootstrap run (its config, funnel counts, pass@k per
    round, monitors, training loss, the report's plots) to MLflow, and to Weights & Biases
    where it is installed. Off unless the section is given; never part of a run's identity."""

    mlflow: bool = Field(True, description="log to MLflow")
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else a local SQLite "
        "store, <lake>/mlflow.db, with artifacts in <lake>/mlartifacts)",
    )
    experiment: str | None = Field(None, description="MLflow experiment (default: the name)")
    wandb: bool = Field(False, description="also log to Weights & Biases (wandb installed)")
    wandb_project: str | None = Field(None, description="W&B project (default: thresher)")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="W&B mode (default: $WANDB_MODE, else online)"
    )


class StageConfig(_Strict):
    """The fields every stage's config has."""

    counted_at_default = frozenset({"name"})

    name: str = Field(
        description="the pipeline's name: runs, reports and models are filed under it"
    )
    lake: str | None = never(
        default=None, description="lake folder or URL (else --lake / THRESHER_LAKE)"
    )
    tracking: TrackingConfig | None = never(
        default=None, description="log runs to MLflow / W&B (off unless given)"
    )


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate."""


def load_config(path: str | Path, kind: type[BaseModel] | None = None) -> Any:
    """Read and validate a pipeline YAML config (curate by default)."""
    if kind is None:
        from thresher.config.curate import CurateConfig  # local: cycle with thresher.config.curate

        kind = CurateConfig
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    try:
        return kind(**data)
    except ValidationError as e:
        lines = [f"{path}: invalid config"]
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None
