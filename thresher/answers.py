"""Final answers as keys: one spelling per value, so that answer shares count values."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$")


def answer_key(answer: str | None) -> str | None:
    """The answer with case, spacing, a trailing full stop and number spelling folded
    ("1.0", "+1" and "1" are one key; "2,744" is "2744"); None stays None."""
    if answer is None:
        return None
    a = " ".join(str(answer).split()).lower().strip("$").rstrip(".").strip()
    if _NUMBER.match(a):
        try:
            value = Decimal(a.replace(",", ""))
        except InvalidOperation:
            return a
        if value == value.to_integral_value():
            return str(int(value))
        return format(value.normalize(), "f")
    return a
