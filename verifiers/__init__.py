"""Verifiers: score candidates, one verdict row per candidate and verifier.

A verifier is a subclass of `base.Verifier`; defining one registers it under its `name`.
Besides the built-in ones, a config may name a user's verifier as `module.path:ClassName`
(imported on first use), and installed packages may offer verifiers through the entry
point group `thresher.verifiers` (loaded once per process, by the first `registry()`).
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable
from typing import Any

import polars as pl
from pydantic import BaseModel, ValidationError

from thresher.verifiers.base import Verifier, class_path, registered

BUILT_IN = ("exact", "math_answer", "rules", "code", "reward", "judge", "majority", "envs")
ENTRY_POINT_GROUP = "thresher.verifiers"
_LOCK = threading.RLock()  # reentrant: a plugin's module may call registry() as it loads
_LOADED = {"built_in": False, "plugins": False}
_PLUGINS: set[str] = set()  # names the entry points registered


def _load() -> None:
    """Import the built-in verifiers and, once per process, the entry points' ones."""
    with _LOCK:
        if not _LOADED["built_in"]:
            for module in BUILT_IN:
                importlib.import_module(f"thresher.verifiers.{module}")
            _LOADED["built_in"] = True
        if not _LOADED["plugins"]:
            _LOADED["plugins"] = True
            _load_plugins()


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        before = set(registered())
        try:
            loaded = ep.load()
        except Exception as e:  # one broken plugin must not stop every other verifier
            warnings.warn(
                f"verifier plugin {ep.name} = {ep.value} did not load: {type(e).__name__}: {e}",
                RuntimeWarning,
                stacklevel=4,
            )
            continue
        if isinstance(loaded, type) and not (
            issubclass(loaded, Verifier) and "name" in loaded.__dict__
        ):
            warnings.warn(
                f"verifier plugin {ep.name} = {ep.value} is not a Verifier subclass with a name",
                RuntimeWarning,
                stacklevel=4,
            )
        _PLUGINS.update(set(registered()) - before)


def registry() -> dict[str, type[Verifier]]:
    """Verifier names and their classes: the built-in ones, the entry points' and those
    imported so far."""
    _load()
    return registered()


def verifier_class(name: str) -> type[Verifier]:
    """The class of verifier `name`: a registered name, or `module.path:ClassName` (imported,
    which registers it under its own `name`); KeyError when there is none."""
    known = registry()
    if name in known:
        return known[name]
    if ":" not in name:
        raise KeyError(
            f"unknown verifier {name!r}; known: {', '.join(sorted(known))} "
            "(or module.path:ClassName)"
        )
    module, _, qualname = name.partition(":")
    if not module or not qualname:
        raise KeyError(f"verifier {name!r} is not of the form module.path:ClassName")
    try:
        found: Any = importlib.import_module(module)
    except Exception as e:  # not importable, or its verifier refused (a name taken)
        raise KeyError(f"verifier {name!r}: importing {module} failed ({e})") from None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, Verifier)):
        raise KeyError(f"verifier {name!r}: {module} has no Verifier subclass {qualname}")
    if "name" not in found.__dict__:
        raise KeyError(f"verifier {name!r}: {qualname} sets no `name` of its own")
    return found


def verifier_name(name: str) -> str:
    """The name verifier `name` goes by in rules and verdict rows (a `module:Class` spelling
    becomes the class's `name`)."""
    return verifier_class(name).name


def portable_name(name: str) -> str:
    """How another process names verifier `name`: its name when `registry()` finds it there
    (built-in or an entry point's), else its `module:Class`."""
    cls = verifier_class(name)
    if cls.__module__.startswith("thresher.verifiers.") or cls.name in _PLUGINS:
        return cls.name
    return class_path(cls)


def traits(name: str) -> dict[str, Any]:
    """A verifier's version, uses_device, ranks, groups, uses_reference, reads_tool_output
    and operational options."""
    cls = verifier_class(name)
    return {
        "version": cls.version,
        "uses_device": cls.uses_device,
        "ranks": cls.ranks,
        "groups": cls.groups,
        "uses_reference": cls.uses_reference,
        "reads_tool_output": cls.reads_tool_output,
        "operational": frozenset(cls.operational),
    }


def options_digest(name: str, options: dict[str, Any] | None = None) -> str:
    """What identifies a verifier's verdicts besides the candidate: name, version, options
    (those that only say how it runs, such as a judge's concurrency, left out)."""
    from thresher.ids import content_id

    cls = verifier_class(name)
    # the options as given, not as validated: defaults filled in would change every digest
    kept = {k: v for k, v in (options or {}).items() if k not in cls.operational}
    return content_id("verifier", cls.name, cls.version, kept)


def tests_suite(options: dict[str, dict[str, Any]]) -> str:
    """The tests the `code` verifier runs under a config's verifier options: original or
    strengthened (those `thresher tests-audit` made)."""
    return (options.get("code") or {}).get("tests", "original")


def reward_model_option(options: dict[str, dict[str, Any]]) -> str | None:
    """The model the `reward` verifier scores with under a config's verifier options."""
    model = (options.get("reward") or {}).get("model")
    return str(model) if model else None


def local_judge_model(options: dict[str, dict[str, Any]]) -> str | None:
    """The model the `judge` verifier runs on this process's engine under a config's
    verifier options (None: it has a server of its own, or no model)."""
    judge = options.get("judge") or {}
    if judge.get("server") or not judge.get("model"):
        return None
    return str(judge["model"])


def _option_problems(error: ValidationError, options: type[BaseModel]) -> list[str]:
    """`field: message` for each error of a validation of verifier options."""
    lines = []
    for e in error.errors():
        field = ".".join(str(p) for p in e["loc"])
        if not field:
            kind = type(e["input"]).__name__
            lines.append(f"options: a mapping of option names to values, not a {kind}")
        elif e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            known = ", ".join(options.model_fields) or "none"
            lines.append(f"{field}: unknown option (known: {known})")
        elif e["type"] == "value_error":  # a validator's own message, without pydantic's prefix
            lines.append(f"{field}: {e['ctx']['error']}")
        else:
            lines.append(f"{field}: {e['msg']}")
    return lines


def get_verifier(name: str, options: dict[str, Any] | None = None) -> Verifier:
    """Verifier `name` (a registered name or `module:Class`) built with its options, which
    are checked against its `Options` first; ValueError names each bad one."""
    cls = verifier_class(name)
    bad = f"bad options for verifier {name!r}"
    try:
        checked = cls.Options.model_validate(options or {})
    except ValidationError as e:
        lines = _option_problems(e, cls.Options)
        if len(lines) == 1:
            raise ValueError(f"{bad}: {lines[0]}") from None
        raise ValueError(f"{bad}:\n" + "\n".join(f"  {line}" for line in lines)) from None
    try:
        return cls(**checked.model_dump(exclude_unset=True))
    except TypeError as e:
        raise ValueError(f"{bad}: {e}") from None


def _here(cfg: Any):
    return lambda name, options, rows: get_verifier(name, options).run(rows)


def _on_cluster(cfg: Any):
    from thresher.verifiers.cluster import verify_on_cluster

    return lambda name, options, rows: verify_on_cluster(cfg.ray, name, options, rows)


RUNNERS = {"local": _here, "ray": _on_cluster}


def runner_for(
    cfg: Any,
) -> Callable[[str, dict[str, Any] | None, pl.DataFrame], pl.DataFrame]:
    """Where verification runs, chosen once from a config's `executor`: a function from
    (verifier name, options, rows) to verdicts, here or in chunks on its Ray cluster."""
    return RUNNERS[cfg.executor](cfg)


def verify(
    batch: pl.DataFrame, names: list[str], options: dict[str, dict[str, Any]] | None = None
) -> pl.DataFrame:
    """Every named verifier's verdicts on every row of `batch`."""
    options = options or {}
    frames = [get_verifier(name, options.get(name)).run(batch) for name in names]
    return pl.concat(frames) if frames else pl.DataFrame()
