"""Selection's rules own the drop reasons: every reason has a rule, and the funnel counts
each rule's drops under the column the rule names."""

import re

from thresher.selection.select import FUNNEL_DROPS, REASONS, RULES
from thresher.stores.lake import FUNNEL_COUNTS_SQL
from thresher.stores.schemas import DropReason


def test_every_drop_reason_has_a_rule():
    assert set(REASONS) == set(DropReason)
    assert all(isinstance(rule.reason, DropReason) for rule in RULES)


def test_the_funnel_counts_each_rules_drops_under_its_column():
    for rule in RULES:
        if rule.column is not None:
            assert f"FILTER (WHERE {rule.reason.sql()}) AS {rule.column}" in FUNNEL_COUNTS_SQL


def test_the_funnel_has_no_drop_column_without_a_rule():
    columns = set(re.findall(r"\bAS (\w+)", FUNNEL_COUNTS_SQL)) - {"passed", "kept"}
    assert columns == set(FUNNEL_DROPS)


def test_only_failed_and_weak_tests_are_left_out_of_the_funnel():
    # the funnel counts what `failed` leaves as `passed`; weak_tests has no column there
    left_out = {rule.reason for rule in RULES if rule.column is None}
    assert left_out == {DropReason.failed, DropReason.weak_tests}
