from datetime import UTC, datetime

import pytest

from openrebench.api import Direction, NormConstants
from openrebench.runs import ScoreRow, final_row, final_score, normalise

LN = NormConstants(start=4.0, reference=2.0, source="test")  # lower is better
UP = NormConstants(start=0.5, reference=0.9, source="test")  # higher is better


def row(i: int, raw: float | None) -> ScoreRow:
    return ScoreRow(index=i, timestamp=datetime.now(UTC), elapsed_s=i, kind="score", charged=True,
                    raw=raw, normalised=None, message="")


def test_normalise_maps_start_to_zero_and_reference_to_one_in_both_directions() -> None:
    assert normalise(4.0, LN) == 0.0
    assert normalise(2.0, LN) == 1.0
    assert normalise(3.0, LN) == pytest.approx(0.5)
    assert normalise(0.9, UP) == pytest.approx(1.0)
    assert normalise(0.7, UP) == pytest.approx(0.5)


def test_normalise_floors_below_start_and_does_not_cap_above_reference() -> None:
    assert normalise(5.0, LN) == 0.0
    assert normalise(0.1, UP) == 0.0
    assert normalise(1.0, LN) == pytest.approx(1.5)
    assert normalise(1.3, UP) == pytest.approx(2.0)


def test_invalid_stays_invalid_and_degenerate_constants_are_rejected() -> None:
    assert normalise(None, LN) is None
    with pytest.raises(ValueError):
        normalise(1.0, NormConstants(start=1.0, reference=1.0, source="bad"))


def test_final_row_picks_best_or_last_valid() -> None:
    rows = [row(0, 4.0), row(1, 2.5), row(2, None), row(3, 3.0), row(4, None)]
    assert final_row(rows, Direction.MIN).index == 1
    assert final_row(rows, Direction.MAX).index == 0
    assert final_row(rows, Direction.LAST).index == 3


def test_final_score_with_no_valid_row_is_zero() -> None:
    assert final_score([row(0, None), row(1, None)], Direction.MIN, LN) == (None, 0.0)
    assert final_score([], Direction.LAST, LN) == (None, 0.0)
    assert final_score([row(0, 3.0)], Direction.MIN, LN) == (3.0, pytest.approx(0.5))
