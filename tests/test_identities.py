"""Identities: each stage's id comes from the fields that determine its output, and the ids
of existing configs never change (tests/data/identity_pins.json holds them as first computed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from identity_cases import all_ids

PINS = json.loads((Path(__file__).parent / "data" / "identity_pins.json").read_text())


def test_pinned_configs_are_all_here():
    assert set(all_ids()) == set(PINS)


@pytest.mark.parametrize("name", sorted(PINS))
def test_ids_of_existing_configs_are_pinned(name):
    assert all_ids()[name] == PINS[name]


def _sections(model, path=()):
    """(path, section) of every config model inside `model`, itself first."""
    from pydantic import BaseModel

    yield path, model
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _sections(value, (*path, name))


def _with(model, path, section):
    """`model` with the section at `path` replaced by `section` (no validation)."""
    if not path:
        return section
    head, *rest = path
    return model.model_copy(update={head: _with(getattr(model, head), rest, section)})


def _grown(section, value=None):
    """`section` as an instance of a subclass with one more field (default 7), set to
    `value` when given."""
    from pydantic import create_model

    grown = create_model(f"{type(section).__name__}Grown", __base__=type(section), added=(int, 7))
    fields = {n: getattr(section, n) for n in type(section).model_fields}
    return grown.model_construct(**fields, **({} if value is None else {"added": value}))


def _configs():
    from identity_cases import bundled, variants

    return {n: kd for n, kd in (bundled() | variants()).items()}


@pytest.mark.parametrize("name", sorted(PINS))
def test_a_new_defaulted_field_in_any_section_changes_no_identity(name):
    from identity_cases import build, ids_of_config

    kind, data = _configs()[name]
    cfg = build(kind, data)
    before = ids_of_config(kind, cfg)
    assert before == PINS[name]
    grown_any = set_any = 0
    for path, section in list(_sections(cfg)):
        assert ids_of_config(kind, _with(cfg, path, _grown(section))) == before, path
        grown_any += 1
        # set to something else, the new field counts where its section does
        if ids_of_config(kind, _with(cfg, path, _grown(section, 8))) != before:
            set_any += 1
    assert grown_any >= 4 and set_any >= 2


def test_each_stage_identity_changes_with_its_own_fields_and_what_is_downstream():
    """One field per stage changed: exactly that stage's identity and those downstream of
    it change (candidates -> verdicts -> selection; the curate run holds them all)."""
    from identity_cases import build, ids_of_config

    kind, data = _configs()["demo"]
    base = ids_of_config(kind, build(kind, data))

    def changed(**update) -> set[str]:
        ids = ids_of_config(kind, build(kind, {**data, **update}))
        return {k for k in ids if ids[k] != base[k]}

    sampling = {**data.get("sampling", {}), "temperature": 0.31}
    assert changed(sampling=sampling) == {"candidate", "selection", "run"}
    options = {"math": {"timeout_s": 9}}
    assert changed(verify={**data["verify"], "options": options}) == {
        "verdicts",
        "selection",
        "run",
    }
    select = {**data.get("select", {}), "cap": 1}
    assert changed(select=select) == {"selection", "run"}
    assert changed(batch_size=3, gates={"force_reward_model": True}) == set()

    train_kind, train = _configs()["train-demo"]
    before = ids_of_config(train_kind, build(train_kind, train))
    assert ids_of_config(train_kind, build(train_kind, {**train, "epochs": 7})) != before
    assert ids_of_config(train_kind, build(train_kind, {**train, "packing": False})) == before

    boot_kind, boot = _configs()["bootstrap-demo"]
    first = ids_of_config(boot_kind, build(boot_kind, boot))
    more = ids_of_config(boot_kind, build(boot_kind, {**boot, "max_rounds": 9}))
    assert more == first  # a stop rule continues the same run
    ev = {**boot["eval"], "n": 4, "ks": [1, 4]}
    evald = ids_of_config(boot_kind, build(boot_kind, {**boot, "eval": ev}))
    moved = {k for k in first if evald[k] != first[k]}
    assert moved == {"bootstrap", "round0.eval", "round1.eval"}


@pytest.mark.parametrize("name", sorted(PINS))
def test_tracking_is_off_by_default_and_never_part_of_an_identity(name):
    from identity_cases import build, ids_of_config

    kind, data = _configs()[name]
    assert build(kind, data).tracking is None  # no bundled config logs anywhere
    tracked = {"tracking_uri": "sqlite:////tmp/elsewhere.db", "experiment": "x", "wandb": True}
    assert ids_of_config(kind, build(kind, data | {"tracking": tracked})) == PINS[name]
