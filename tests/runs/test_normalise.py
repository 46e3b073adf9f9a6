import math
from datetime import UTC, datetime

import pytest

from openrebench.api import Direction, NormConstants
from openrebench.runs import (
    Run,
    ScoreRow,
    environment_classes,
    final_row,
    final_score,
    normalise,
    paper_constants,
    paper_matched,
    read_log,
    score_run,
)

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


def test_paper_matched_uses_the_papers_gap_from_the_start_measured_here() -> None:
    measured = NormConstants(start=1.2, reference=-0.9, source="ours")  # ln ms: 3.32 ms -> 0.41 ms
    paper = NormConstants(start=math.log(4.76), reference=math.log(1.6), source="paper")  # 3.0x faster
    assert paper_matched(1.2, measured, paper) == 0.0
    # 3x faster than our own start is 1 on the paper's scale, wherever our reference lies
    assert paper_matched(1.2 - math.log(4.76 / 1.6), measured, paper) == pytest.approx(1.0)
    assert normalise(-0.9, measured) == pytest.approx(1.0)
    assert paper_matched(-0.9, measured, paper) == pytest.approx(2.1 / math.log(4.76 / 1.6))
    assert paper_matched(1.5, measured, paper) == 0.0  # below the start: floored, as measured
    assert paper_matched(None, measured, paper) is None and paper_matched(0.3, measured, None) is None
    with pytest.raises(ValueError):
        paper_matched(1.0, measured, NormConstants(start=1.0, reference=1.0, source="bad"))


def test_every_environment_has_paper_constants_on_every_tier() -> None:
    for env_id, cls in environment_classes().items():
        if not cls.__module__.startswith("openrebench.environments."):
            continue  # a plug-in (the example package) is no environment of the paper's
        for tier in cls.tiers:
            paper = paper_constants(cls, tier)
            assert paper is not None and paper.start != paper.reference, (env_id, tier)
            assert "paper" in paper.source.lower(), (env_id, tier, paper.source)


@pytest.mark.slow
def test_a_scoring_records_both_normalised_scores(kernel_run: Run) -> None:
    row = score_run(kernel_run, sandboxed=False, timeout_s=120)
    assert row.raw is not None, row.message
    paper = paper_constants(kernel_run.env, "mini")
    assert row.details["paper_normalisation"] == paper.model_dump()
    assert row.normalised == normalise(row.raw, kernel_run.info.constants)
    assert row.normalised_paper == paper_matched(row.raw, kernel_run.info.constants, paper)
    assert read_log(kernel_run.score_log_path)[0][-1].normalised_paper == row.normalised_paper
