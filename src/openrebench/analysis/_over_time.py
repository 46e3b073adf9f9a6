"""Score over time from score logs: each run's best-so-far score, interpolated log-linearly in time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._estimators import Array


def best_so_far(trajectory: Sequence[tuple[float, float | None]], last: bool) -> list[tuple[float, float]]:
    """(hours, score) after each valid scoring: the best so far, or the last so far where the last valid
    scoring is a run's score (direction `last`, as where the agent cannot see its score). Starts at the
    starting solution's score (0)."""
    points: list[tuple[float, float]] = [(0.0, 0.0)]
    current = 0.0
    for t, value in sorted(trajectory, key=lambda p: p[0]):
        if value is None:
            continue
        current = value if last else max(current, value)
        points.append((t, current))
    return points


def score_at(trajectory: Sequence[tuple[float, float | None]], hours: float, last: bool) -> float:
    """The score a run had reached `hours` into it (a step function: no interpolation)."""
    reached = [s for t, s in best_so_far(trajectory, last) if t <= hours]
    return reached[-1]


def interpolated(trajectory: Sequence[tuple[float, float | None]], grid: Array, last: bool) -> Array:
    """Best-so-far on `grid` (hours, > 0), linear in log(time) between scorings, as the paper plots it.

    Scorings at or before the grid's first time are placed there (log 0 does not exist); after the
    last scoring the score holds.
    """
    first = float(grid[0])
    times: list[float] = []
    scores: list[float] = []
    for t, s in best_so_far(trajectory, last):
        t = max(t, first)
        if times and t == times[-1]:
            scores[-1] = s
        else:
            times.append(t)
            scores.append(s)
    return np.interp(np.log(grid), np.log(np.asarray(times)), np.asarray(scores))


def time_grid(max_hours: float, points: int = 60, first_hours: float = 1 / 60) -> Array:
    """Log-spaced times from one minute (or less, for very short runs) to `max_hours`."""
    first = min(first_hours, max_hours / 100)
    return np.geomspace(first, max_hours, points)
