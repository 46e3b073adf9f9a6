"""Normalisation (start = 0, reference = 1, floored at 0, no cap) and final-score selection."""

from __future__ import annotations

from collections.abc import Sequence

from openrebench.api._environment import Direction, NormConstants

from ._score_log import ScoreRow


def normalise(raw: float | None, constants: NormConstants) -> float | None:
    """y_n = (y - y_start) / (y_ref - y_start), below the start -> 0; None stays None (invalid)."""
    if raw is None:
        return None
    span = constants.reference - constants.start
    if span == 0:
        raise ValueError("normalisation constants have start == reference")
    return max(0.0, (raw - constants.start) / span)


def final_row(rows: Sequence[ScoreRow], direction: Direction) -> ScoreRow | None:
    """The row that a run's final score comes from: best (min/max) or last valid; None if no valid row."""
    valid = [r for r in rows if r.raw is not None]
    if not valid:
        return None
    if direction is Direction.LAST:
        return valid[-1]
    pick = min if direction is Direction.MIN else max
    return pick(valid, key=lambda r: r.raw)  # type: ignore[arg-type,return-value]


def final_score(
    rows: Sequence[ScoreRow], direction: Direction, constants: NormConstants
) -> tuple[float | None, float]:
    """(final raw score or None, final normalised score); no valid row -> normalised 0."""
    row = final_row(rows, direction)
    if row is None:
        return None, 0.0
    return row.raw, normalise(row.raw, constants) or 0.0
