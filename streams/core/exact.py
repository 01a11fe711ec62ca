"""Exact float sums that merge by concatenation.

The legacy aliases average per-sample float ratios across partitions. Plain
float addition depends on order, so a partition's sum is kept as a Shewchuk
expansion: non-overlapping floats whose exact sum is the true sum of every
ratio added. Merging expansions is exact; ``math.fsum`` rounds once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

__all__ = ["grow", "merge_expansions", "expansion_value", "exact_sum"]


def grow(parts: list[float], x: float) -> None:
    """Add finite ``x`` to the expansion ``parts`` in place, exactly."""
    i = 0
    for y in parts:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            parts[i] = lo
            i += 1
        x = hi
    parts[i:] = [x]


def merge_expansions(expansions: Iterable[Iterable[float]]) -> list[float]:
    """One expansion whose exact value is the sum of all the given ones."""
    parts: list[float] = []
    for expansion in expansions:
        for x in expansion:
            grow(parts, x)
    return [p for p in parts if p]


def expansion_value(parts: Iterable[float]) -> float:
    """The correctly rounded value of an expansion."""
    return math.fsum(parts)


def exact_sum(parts: Iterable[float]) -> Fraction:
    """The exact rational value of an expansion: equal for every expansion of the
    same sum, whatever order its terms were grown in (for identity, not output)."""
    return sum(map(Fraction, parts), Fraction(0))
