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
