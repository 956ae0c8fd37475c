"""Confidence intervals for rates measured on a few hundred items."""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (low, high) of a rate of `successes` in `n` trials (z = 1.96:
    95 %). With n == 0 it is (0.0, 1.0): no trials rule out no rate, and it is the limit of
    the interval as n shrinks, so a table or a plot needs no special case."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if not z > 0:
        raise ValueError(f"z must be positive, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # at 0 or n successes the bound is exactly 0 or 1 (rounding would leave it a hair off)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
