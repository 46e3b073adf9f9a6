"""Who is set against whom: our mini-tier runs never against the paper's humans (own tables, own panel),
a full-tier run on the paper-matched scale still is; the sampling SE's floor keeps the z of identical
runs finite; the paper's suspected reward hacks are marked in the figures; Claude 3.5 Sonnet (Old) is
the paper's agent."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from analysis_helpers import REAL_LOG, react_log, runs_log
from openrebench.analysis import HUMAN_GROUP, Analysis, analyze, load_logs, load_paper
from openrebench.analysis import _figures as figures
from openrebench.analysis._estimators import SE_FLOOR, Estimate
from openrebench.analysis._tables import DISAGREE_Z, all_tables
from openrebench.cli import app

APART = "not comparable with the paper's humans (tier mini)"
REACT = "react · openai/gpt-4o (mini)"


def _drawn(monkeypatch: pytest.MonkeyPatch, figure: Callable[[Analysis], bytes | None],
           a: Analysis) -> Figure:
    """The matplotlib figure a figure function draws, before it becomes PNG bytes."""
    drawn: list[Figure] = []
    monkeypatch.setattr(figures, "_png", lambda fig: drawn.append(fig) or b"png")
    assert figure(a) == b"png"
    return drawn[0]


def _labels(fig: Figure) -> list[str]:
    legend = fig.legends[0] if fig.legends else next(ax.get_legend() for ax in fig.axes if ax.get_legend())
    return [t.get_text() for t in legend.get_texts()]


@pytest.fixture(scope="module")
def paper() -> Analysis:
    return analyze(load_paper(), boots=20, sims=50)


def test_two_identical_mini_runs_give_a_bounded_z_and_the_floor_is_reported(tmp_path: Path) -> None:
    log = runs_log(tmp_path / "same.eval", agent="react", model="openai/gpt-4o", hours=0.5,
                   runs=[[(0.2, 0.3)], [(0.2, 0.3)]])
    a = analyze(load_logs([log]), boots=50, sims=500)
    assert a.allocations
    for al in a.allocations:
        e = al.estimate
        assert e.sampled_se < 1e-12  # round-off alone: a z over it ran to hundreds of thousands
        assert e.se_floored and math.isfinite(e.disagreement_z) and abs(e.disagreement_z) < 1e-6
        assert abs(e.disagreement_z) == pytest.approx(abs(e.sampled - e.exact) / SE_FLOOR)
    assert any(f"floor of {SE_FLOOR:g}" in n and f"{len(a.allocations)} of {len(a.allocations)} splits" in n
               for n in a.notes)
    table = next(t for t in all_tables(a, full=True) if t.key == "estimators")
    assert "floored" in table.caption and not any("sampling off" in row[-1] for row in table.rows)
    result = CliRunner().invoke(app, ["analyze", str(log), "--boots", "50", "--sims", "500"])
    assert result.exit_code == 0, result.output
    assert "sampling standard error below its floor" in " ".join(result.output.split())


def test_the_floor_leaves_a_standard_error_above_it_alone() -> None:
    real = Estimate(exact=0.50, sampled=0.53, sampled_se=0.01, ci_low=0.4, ci_high=0.6, per_env={})
    assert not real.se_floored and real.disagreement_z == pytest.approx(3.0)
    tiny = Estimate(exact=0.50, sampled=0.50 + 1e-16, sampled_se=1e-18, ci_low=0.5, ci_high=0.5, per_env={})
    assert tiny.se_floored and tiny.disagreement_z == pytest.approx(1e-16 / SE_FLOOR)
    assert abs(tiny.disagreement_z) < DISAGREE_Z


def test_mini_runs_beside_the_paper_get_their_own_tables_and_no_head_to_head_with_its_humans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    react = react_log(tmp_path / "react.eval")
    a = analyze(load_logs([REAL_LOG, react]) + load_paper(), environments=["optimize_kernel"], boots=50,
                sims=50)
    ours = {g.group for g in a.groups if g.kind == "ours"}
    assert ours == {"oracle (mini)", REACT}
    assert all(a.group(g).not_comparable == "tier mini" for g in ours)  # type: ignore[union-attr]
    assert a.comparisons and not {c.agent for c in a.comparisons} & ours  # the paper's agents still are
    assert any(APART in n and "oracle (mini)" in n for n in a.notes)
    tables = all_tables(a, full=True)
    apart = {t.key: t for t in tables if APART in t.title}
    assert {k.split("_tier")[0] for k in apart} == {"groups", "budget", "per_env"}
    for t in apart.values():  # only our mini groups, and not a word of the paper's humans in their cells
        assert APART[0].upper() + APART[1:] in t.caption
        cells = [c for row in t.rows for c in row] + t.columns
        assert not any(HUMAN_GROUP in c or "o1-preview" in c for c in cells)
    assert {row[0] for row in apart[next(k for k in apart if k.startswith("budget"))].rows} == ours
    main = {t.key: t for t in tables}
    for key in ("groups", "budget", "humans"):
        assert not any(name in cell for row in main[key].rows for cell in row for name in ours), key
    assert not any(name in main["per_env"].columns for name in ours)
    # Figures: a panel of their own, with no human in it; left out of the one-cohort figures.
    fig = _drawn(monkeypatch, figures.budget_figure, a)
    (panel,) = [ax for ax in fig.axes if "not comparable" in ax.get_title()]
    assert "(tier mini)" in panel.get_title()
    drawn = {line.get_label() for line in panel.get_lines()} | {c.get_label() for c in panel.containers}
    assert {"oracle (mini)", REACT} <= drawn and not any("Human" in d for d in drawn)
    for ax in fig.axes:
        if ax is not panel:
            assert not {c.get_label() for c in ax.containers} & ours
    for key in ("k", "per_env"):
        assert "Left out of this figure" in figures.FIGURES[key][2](a) and APART in figures.FIGURES[key][2](a)
    fig = _drawn(monkeypatch, figures.percentile_figure, a)
    assert not any(label.startswith(("oracle", "react")) for label in _labels(fig))


def test_a_persons_mini_runs_meet_mini_agents_but_neither_meets_the_paper(tmp_path: Path) -> None:
    human = runs_log(tmp_path / "human.eval", agent="human", model="none", hours=8.0,
                     runs=[[(0.5, 0.1), (7.5, 0.9)], [(1.5, 0.3), (6.0, 0.5)]])
    a = analyze(load_logs([human, REAL_LOG]) + load_paper(), environments=["optimize_kernel"], boots=50,
                sims=50)
    pairs = {(c.agent, c.human) for c in a.comparisons}
    assert ("oracle (mini)", "human (mini)") in pairs and ("o1-preview", HUMAN_GROUP) in pairs
    assert ("oracle (mini)", HUMAN_GROUP) not in pairs and ("o1-preview", "human (mini)") not in pairs
    table = next(t for t in all_tables(a) if t.key == "humans")
    assert {row[4] for row in table.rows} == {"human (mini)", HUMAN_GROUP}  # the human group is named


def test_a_full_tier_run_on_the_paper_matched_scale_is_still_compared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = runs_log(tmp_path / "full.eval", agent="react", model="openai/gpt-4o", hours=2.0, tier="full",
                   runs=[[(1.0, 0.2)], [(1.5, 0.4)], [(0.5, 0.1)]])
    name = "react · openai/gpt-4o (full)"
    a = analyze(load_logs([log]) + load_paper(), environments=["optimize_kernel"], boots=50, sims=50)
    group = a.group(name)
    assert group is not None and group.cohort == "paper" and group.not_comparable is None
    assert a.cohorts() == ["paper"]
    comp = next(c for c in a.comparisons if c.agent == name and c.budget_h == 8.0)
    assert comp.human == HUMAN_GROUP and comp.human_score is not None and comp.percentile is not None
    assert comp.ratio == pytest.approx(comp.agent_score / comp.human_score)
    tables = all_tables(a)
    assert not any("not comparable" in t.title for t in tables)
    assert any(row[0] == name for t in tables if t.key == "budget" for row in t.rows)
    fig = _drawn(monkeypatch, figures.budget_figure, a)
    first = {c.get_label() for c in fig.axes[0].containers}
    assert name in first and HUMAN_GROUP in first  # in the humans' own panel


def test_suspected_reward_hacks_are_marked_in_the_figures_with_a_legend_entry(
        paper: Analysis, monkeypatch: pytest.MonkeyPatch) -> None:
    marked = [p for p in paper.allocations if p.hacks_altered or p.hacks_kept]
    assert marked and all(p.group == "o1-preview" and p.length_h == 0.5 for p in marked)
    # mp4-server_204921 (4.05) zeroed under the paper's treatment; mp4-server_204851 (1.66) kept.
    assert all(p.hacks_altered == p.hacks_kept == ["optimize_finetune"] for p in marked)
    fig = _drawn(monkeypatch, figures.budget_figure, paper)
    labels = _labels(fig)
    assert any("treated as a reward hack" in t for t in labels)
    assert any("kept at its released" in t for t in labels)
    crosses = sum(len(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()
                  if line.get_marker() == "x")
    assert crosses == len([p for p in paper.curve("o1-preview") if p.length_h == 0.5])
    fig = _drawn(monkeypatch, figures.per_env_figure, paper)
    with_marks = {ax.get_title() for ax in fig.axes
                  if any(line.get_marker() == "x" for line in ax.get_lines())}
    assert with_marks == {"optimize_finetune"}
    caption = figures.FIGURES["budget"][2](paper)
    assert "a cross where" in caption and "a ring where" in caption and "1.66" in caption
    kept = analyze(load_paper(hacks="keep"), boots=20, sims=50)  # nothing altered: rings only
    labels = _labels(_drawn(monkeypatch, figures.budget_figure, kept))
    assert not any("treated as a reward hack" in t for t in labels)
    assert any("kept at its released score (--hacks keep)" in t for t in labels)


def test_claude_35_sonnet_old_is_labelled_as_the_papers_agent_it_is(paper: Analysis,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    old = paper.group("Claude 3.5 Sonnet (Old)")
    assert old is not None and old.kind == "paper agent" and "paper's agent" in old.label
    assert paper.group("GPT-4o").kind == "release model"  # type: ignore[union-attr]
    groups = next(t for t in all_tables(paper) if t.key == "groups")
    assert next(row for row in groups.rows if row[0] == old.group)[1] == "paper's agent"
    fig = _drawn(monkeypatch, figures.budget_figure, paper)
    assert fig.axes[0].get_title() == "The paper's agents"
    assert old.label in {c.get_label() for c in fig.axes[0].containers}
