"""Time budgets: a total budget T spent as k runs of length L (k·L = T), and the best split per group."""

from __future__ import annotations

import math
from collections.abc import Iterable


def default_budgets(lengths: Iterable[float], max_budget_h: float = 32.0) -> list[float]:
    """Every L·2^j up to `max_budget_h` for the run lengths present (the paper's 0.5, 2 and 8 h give
    0.5, 1, 2, 4, 8, 16, 32 h)."""
    budgets: set[float] = set()
    for length in lengths:
        if length <= 0:
            continue
        t = length
        while t <= max_budget_h * (1 + 1e-9):
            budgets.add(round(t, 9))
            t *= 2
    return sorted(budgets)


def runs_for(budget_h: float, length_h: float) -> int | None:
    """k with k·L = T, or None when T is not a whole number of runs of length L."""
    if length_h <= 0:
        return None
    k = budget_h / length_h
    nearest = round(k)
    if nearest >= 1 and math.isclose(k, nearest, rel_tol=1e-6):
        return int(nearest)
    return None


def fmt_hours(hours: float) -> str:
    """0.5 -> '30 min', 2 -> '2 h', 1.25 -> '1.25 h'."""
    if hours < 1:
        return f"{hours * 60:.3g} min"
    return f"{hours:g} h"
