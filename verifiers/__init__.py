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

from thresher.ids import content_id
from thresher.verifiers.base import HeldOutRole, Verifier, class_path, registered

BUILT_IN = ("exact", "math_answer", "rules", "code", "reward", "judge", "majority", "envs")
DEFAULT_VERIFIERS = ("exact",)  # a pipeline's verifiers when its config names none
# an evaluation's verifiers when its config names none (and an RL export's when no run
# recorded any): they check the prompt's reference answer
EVAL_VERIFIERS = ("math",)
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
    cls = verifier_class(name)
    # the options as given, not as validated: defaults filled in would change every digest
    kept = {k: v for k, v in (options or {}).items() if k not in cls.operational}
    return content_id("verifier", cls.name, cls.version, kept)


def held_out_role(name: str) -> HeldOutRole | None:
    """How verifier `name` takes part in held-out evaluation (`Verifier.held_out_role`)."""
    return verifier_class(name).held_out_role()


def in_role(role: HeldOutRole, names: list[str] | None = None) -> list[str]:
    """The verifiers among `names` (default: every registered one) whose held-out role is
    `role`, in their order."""
    return [n for n in (registry() if names is None else names) if held_out_role(n) == role]


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


def checked_options(
    name: str, options: dict[str, Any] | None = None, error: type[ValueError] = ValueError
) -> BaseModel:
    """Verifier `name`'s options checked against its `Options`; `error` names each bad one."""
    cls = verifier_class(name)
    try:
        return cls.Options.model_validate(options or {})
    except ValidationError as e:
        raise error(_bad_options(name, _option_problems(e, cls.Options))) from None


def _bad_options(name: str, lines: list[str]) -> str:
    bad = f"bad options for verifier {name!r}"
    if len(lines) == 1:
        return f"{bad}: {lines[0]}"
    return f"{bad}:\n" + "\n".join(f"  {line}" for line in lines)


def get_verifier(name: str, options: dict[str, Any] | None = None) -> Verifier:
    """Verifier `name` (a registered name or `module:Class`) built with its options, which
    are checked against its `Options` first; ValueError names each bad one."""
    checked = checked_options(name, options)
    try:
        return verifier_class(name)(**checked.model_dump(exclude_unset=True))
    except TypeError as e:
        raise ValueError(f"bad options for verifier {name!r}: {e}") from None


def _here(cfg: Any):
    return lambda name, options, rows: get_verifier(name, options).run(rows)


def _on_cluster(cfg: Any):
    from thresher.verifiers.cluster import verify_on_cluster  # local: cycle with verifiers.cluster

    return lambda name, options, rows: verify_on_cluster(cfg.ray, name, options, rows)


RUNNERS = {"local": _here, "ray": _on_cluster}


def runner_for(
    cfg: Any,
) -> Callable[[str, dict[str, Any] | None, pl.DataFrame], pl.DataFrame]:
    """Where verification runs, chosen once from a config's `executor`: a function from
    (verifier name, options, rows) to verdicts, here or in chunks on its Ray cluster."""
    return RUNNERS[cfg.executor](cfg)
