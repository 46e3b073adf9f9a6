"""Our runs on two scales (measured, paper-matched) and beside the paper's humans; a person's own runs
(the human agent's logs) with their score over time."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from inspect_ai.log import EvalLog
from typer.testing import CliRunner

from analysis_helpers import REAL_LOG, runs_log, write_variant
from openrebench.analysis import analyze, load_logs, load_paper
from openrebench.cli import app
from openrebench.runs import environment_classes, paper_constants

FAST = ("--boots", "100", "--sims", "100")
KERNEL_PAPER = (math.log(4.76), math.log(1.6))  # the paper's H100 start and reference, ln ms


def test_a_log_without_the_paper_matched_score_gets_it_from_its_raw_score() -> None:
    (a,) = load_logs([REAL_LOG]).attempts
    assert a.constants is not None and a.raw is not None
    start, ref = KERNEL_PAPER
    assert a.paper_constants is not None
    assert (a.paper_constants.start, a.paper_constants.reference) == (start, ref)
    assert a.scores["measured"] == a.score == pytest.approx((a.raw - a.constants.start)
                                                            / (a.constants.reference - a.constants.start))
    assert a.scores["paper"] == pytest.approx((a.raw - a.constants.start) / (ref - start))
    assert a.trajectories["paper"][-1][1] == pytest.approx(a.scores["paper"])
    assert a.trajectories["paper"][0] == (0.0, 0.0)  # the untouched start is 0 on both scales


def _with_paper_score(value: float):  # type: ignore[no-untyped-def]
    def edit(log: EvalLog) -> None:
        score = log.samples[0].scores["rebench_scorer"]  # type: ignore[index,union-attr]
        score.metadata["normalised_paper"] = value  # type: ignore[index]
        for row in score.metadata["score_log"]:  # type: ignore[index]
            row["normalised_paper"] = value if row["raw"] is not None and row["kind"] == "score" else 0.0

    return edit


def test_the_scorers_paper_matched_score_is_used_where_the_log_has_it(tmp_path: Path) -> None:
    (a,) = load_logs([write_variant(tmp_path / "p.eval", _with_paper_score(0.42))]).attempts
    assert a.scores["paper"] == 0.42 and a.trajectories["paper"][-1][1] == 0.42
    assert a.scores["measured"] == pytest.approx(1.0095, abs=1e-3)


def test_beside_the_papers_humans_full_tier_runs_are_on_the_paper_matched_scale_unless_told(
        tmp_path: Path) -> None:
    log = runs_log(tmp_path / "full.eval", agent="react", model="openai/gpt-4o", hours=2.0, tier="full",
                   runs=[[(1.0, 0.2)], [(1.5, 0.4)]])
    logs = load_logs([log])
    runs = logs.attempts
    alone = analyze(logs, boots=20, sims=20)
    assert alone.settings.normalisation == "measured"
    name = "react · openai/gpt-4o (full)"
    assert alone.group(name).mean_score == pytest.approx(0.3)  # type: ignore[union-attr]
    both = analyze(logs + load_paper(), environments=["optimize_kernel"], boots=20, sims=20)
    assert both.settings.normalisation == "paper" and both.settings.scales == {"full": "paper"}
    group = both.group(name)
    assert group is not None and group.cohort == "paper" and group.not_comparable is None
    paper_mean = float(np.mean([a.scores["paper"] for a in runs]))
    assert group.mean_score == pytest.approx(paper_mean) and group.mean_paper == pytest.approx(paper_mean)
    assert group.mean_measured == pytest.approx(0.3)
    assert any("paper-matched scale" in n and "paper's humans" in n for n in both.notes)
    measured = analyze(logs + load_paper(), environments=["optimize_kernel"], boots=20, sims=20,
                       normalisation="measured")
    assert measured.group(name).mean_score == pytest.approx(0.3)  # type: ignore[union-attr]
    assert any("not on one scale" in n for n in measured.notes)
    # On the measured scale a full-tier run is not on the paper's humans' scale: kept apart.
    assert measured.group(name).not_comparable == "tier full, measured scale"  # type: ignore[union-attr]
    assert not any(c.agent == name for c in measured.comparisons)
    # The paper's own runs are on the paper's scale either way.
    assert both.group("o1-preview").mean_score == measured.group("o1-preview").mean_score  # type: ignore[union-attr]


def test_beside_the_papers_humans_a_mini_run_stays_on_its_own_measured_scale() -> None:
    logs = load_logs([REAL_LOG])
    (ours,) = logs.attempts
    both = analyze(logs + load_paper(), environments=["optimize_kernel"], boots=20, sims=20)
    assert both.settings.scales == {"mini": "measured"}
    oracle = both.group("oracle (mini)")
    assert oracle is not None and oracle.mean_score == pytest.approx(ours.scores["measured"])
    assert oracle.mean_paper == pytest.approx(ours.scores["paper"])  # both scales still reported
    assert any("tier mini are on the measured scale" in n for n in both.notes)
    asked = analyze(logs + load_paper(), environments=["optimize_kernel"], boots=20, sims=20,
                    normalisation="paper")
    oracle = asked.group("oracle (mini)")
    assert oracle is not None and oracle.mean_score == pytest.approx(ours.scores["paper"])
    assert oracle.not_comparable == "tier mini"
    assert not any(c.agent == "oracle (mini)" for c in asked.comparisons)


def test_both_scales_are_reported_with_the_constants_behind_them() -> None:
    a = analyze(load_logs([REAL_LOG]) + load_paper(), environments=["optimize_kernel"], boots=20, sims=20)
    (row,) = a.normalisation
    (ours,) = load_logs([REAL_LOG]).attempts
    assert ours.constants is not None
    assert (row.start, row.reference) == (ours.constants.start, ours.constants.reference)
    assert (row.paper_start, row.paper_reference) == KERNEL_PAPER
    start, ref = KERNEL_PAPER
    assert row.reference_on_paper_scale == pytest.approx((ours.constants.reference - ours.constants.start)
                                                         / (ref - start))
    by_budget = {r.budget_h: r for r in a.normalisation_budgets}
    assert by_budget[2.0].measured == pytest.approx(ours.scores["measured"])
    assert by_budget[2.0].paper == pytest.approx(ours.scores["paper"])


def test_analyze_prints_both_scales(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", str(REAL_LOG), "--paper", "--json", *FAST])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["settings"]["normalisation"] == "paper" and data["normalisation"][0]["mean_paper"] > 1
    result = CliRunner().invoke(app, ["analyze", str(REAL_LOG), "--paper", *FAST])
    assert "Our runs on both scales" in result.output and "Our score@k on both scales" in result.output


def test_every_registered_environment_has_paper_constants_for_the_analysis() -> None:
    for cls in environment_classes().values():
        if cls.__module__.startswith("openrebench.environments."):  # RE-Bench's; not a plug-in's
            assert paper_constants(cls, "mini") == paper_constants(cls, "full") is not None


def test_a_persons_own_runs_give_score_over_time_and_scores_below_eight_hours(tmp_path: Path) -> None:
    log = runs_log(tmp_path / "human.eval", agent="human", model="none", hours=8.0,
                   runs=[[(0.5, 0.1), (3.0, 0.6), (7.5, 0.9)], [(1.5, 0.3), (6.0, 0.5)]])
    data = load_logs([log])
    assert all(a.is_human and a.group == "human (mini)" for a in data.attempts)
    a = analyze(data + load_logs([REAL_LOG]), boots=50, sims=50)
    (curve,) = [c for c in a.time_curves if c.group == "human (mini)"]
    assert curve.runs == 2 and curve.mean[-1] == pytest.approx((0.9 + 0.5) / 2)
    at2 = a.best_at("human (mini)", 2.0)
    assert at2 is not None and at2.method == "reached_at_budget"
    assert at2.estimate.exact == pytest.approx((0.1 + 0.3) / 2)  # what each run had reached at 2 hours
    comp = next(c for c in a.comparisons if c.human == "human (mini)" and c.budget_h == 2.0)
    assert comp.human_score == pytest.approx(0.2) and comp.ratio == pytest.approx(comp.agent_score / 0.2)
    from openrebench.analysis._figures import FIGURES

    assert FIGURES["over_time"][1](a) is not None and "human (mini)" in FIGURES["over_time"][2](a)
    assert "from 2 h" in FIGURES["budget"][2](a) or "reached by then" in FIGURES["budget"][2](a)


def test_each_run_and_its_score_log_rescale_by_the_ratio_of_the_two_gaps(tmp_path: Path) -> None:
    log = runs_log(tmp_path / "r.eval", agent="react", model="openai/gpt-4o", hours=0.5,
                   runs=[[(0.1, 0.2), (0.3, 0.5)], [(0.2, 0.0)]])
    runs = load_logs([log]).attempts
    c = runs[0].constants
    assert c is not None
    factor = (c.reference - c.start) / (KERNEL_PAPER[1] - KERNEL_PAPER[0])
    assert [a.scores["measured"] for a in runs] == [0.5, 0.0]
    assert [a.scores["paper"] for a in runs] == pytest.approx([0.5 * factor, 0.0])
    assert [s for _, s in runs[0].trajectories["paper"]] == pytest.approx([0.0, 0.2 * factor, 0.5 * factor])
