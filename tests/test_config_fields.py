"""Every config class's `counted_at_default` names fields of that class: a misspelt or
removed field there would silently count nothing in the identities."""

import importlib
import inspect
import pkgutil

import pytest
from pydantic import BaseModel

import thresher.config


def config_classes() -> list[type[BaseModel]]:
    """The pydantic classes defined in thresher.config's modules that declare their own
    `counted_at_default`."""
    found = {}
    for info in pkgutil.iter_modules(thresher.config.__path__):
        module = importlib.import_module(f"thresher.config.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, BaseModel)
                and cls.__module__ == module.__name__
                and "counted_at_default" in vars(cls)
            ):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def test_there_are_config_classes_to_check():
    names = {cls.__name__ for cls in config_classes()}
    assert {"CurateConfig", "EvalConfig", "VerifyConfig", "BootstrapConfig"} <= names


@pytest.mark.parametrize("cls", config_classes(), ids=lambda cls: cls.__name__)
def test_counted_at_default_names_fields_of_its_class(cls):
    unknown = sorted(set(vars(cls)["counted_at_default"]) - set(cls.model_fields))
    assert not unknown, f"{cls.__name__}.counted_at_default names no field: {unknown}"
