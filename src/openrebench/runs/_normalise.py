"""Normalisation (start = 0, reference = 1, floored at 0, no cap) and final-score selection.

Two normalised scores are kept for each valid scoring. The measured one uses this machine's start and
reference. The paper-matched one measures the improvement over the start measured here in units of
the paper's start-to-reference gap (raw-score units, the paper's H100 constants): where our reference
is much stronger than the paper's (optimize_kernel's is 8x faster than its start on an H200 against
the paper's 3x on an H100), a score on the measured scale is not on the scale of the paper's human
baselines, and the paper-matched one is.
"""

from __future__ import annotations

from collections.abc import Sequence

from openrebench.api import Direction, Environment, NormConstants

from ._score_log import ScoreRow


def normalise(raw: float | None, constants: NormConstants) -> float | None:
    """y_n = (y - y_start) / (y_ref - y_start), below the start -> 0; None stays None (invalid)."""
    if raw is None:
        return None
    span = constants.reference - constants.start
    if span == 0:
        raise ValueError("normalisation constants have start == reference")
    return max(0.0, (raw - constants.start) / span)


def paper_constants(env: Environment | type[Environment], tier: str) -> NormConstants | None:
    """The paper's constants for the environment's task: the tier's own, else those another of its tiers
    declares (the task is the paper's at every size; only the full tiers name them); None if no tier
    does."""
    spec = env.tiers.get(tier)
    if spec is not None and spec.paper_constants is not None:
        return spec.paper_constants
    return next((t.paper_constants for t in env.tiers.values() if t.paper_constants is not None), None)


def paper_matched(raw: float | None, measured: NormConstants, paper: NormConstants | None) -> float | None:
    """(y - y_start, measured here) / (y_ref - y_start, the paper's), below the start -> 0; None when the
    scoring was invalid or there are no paper constants."""
    if raw is None or paper is None:
        return None
    span = paper.reference - paper.start
    if span == 0:
        raise ValueError("the paper's constants have start == reference")
    return max(0.0, (raw - measured.start) / span)


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
