"""How the paper's data is read: reward hacks, human attempts by length and rows, partial coverage, the
alternatives and claims tables, and broken data giving one line."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from openrebench.analysis import HUMAN_GROUP, analyze, analyze_paper, expected_max, load_paper
from openrebench.analysis._paper import AGENTS_FILE, HUMANS_FILE, LATER_COLUMN, packaged_file
from openrebench.api import OpenRebenchError
from openrebench.cli import app

FAST = {"boots": 100, "sims": 100}
REVIEWED = "mp4-server_204921"  # o1-preview, optimize_finetune, released 4.05: zeroed in METR's later data
ABOVE_HUMANS = "mp4-server_204851"  # o1-preview, optimize_finetune, released 1.66: only capped there
ENVS = ["chat_rl", "fix_embedding", "optimize_finetune", "optimize_kernel", "restricted_mlm",
        "rust_codecontests", "scaling_law"]


def _released() -> dict[str, dict[str, str]]:
    with packaged_file(AGENTS_FILE).open(encoding="utf-8", newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


def _scores(hacks: str) -> dict[str, float]:
    data = load_paper(hacks=hacks)  # type: ignore[arg-type]
    return {a.run_id: a.score for a in data.attempts if not a.is_human and a.run_id}


def test_the_paper_treatment_zeroes_the_run_metrs_later_data_zeroes_and_no_other() -> None:
    released = _released()
    later_zeroed = {i for i, r in released.items() if r[LATER_COLUMN] and float(r[LATER_COLUMN]) == 0
                    and float(r["normalized_score"] or 0) > 0}
    assert later_zeroed == {REVIEWED}
    paper, keep = _scores("paper"), _scores("keep")
    changed = {i for i in paper if paper[i] != keep[i]}
    assert changed == {REVIEWED} and paper[REVIEWED] == 0.0
    assert keep[REVIEWED] == pytest.approx(float(released[REVIEWED]["normalized_score"]))
    assert keep[ABOVE_HUMANS] == paper[ABOVE_HUMANS] == pytest.approx(1.663708)
    data = load_paper()
    assert data.paper is not None and [r.run_id for r in data.paper.altered] == [REVIEWED]
    assert {r.run_id for r in data.paper.suspects} == {REVIEWED, ABOVE_HUMANS}
    (run,) = [a for a in data.attempts if a.run_id == REVIEWED]
    assert run.released_score == pytest.approx(4.052531) and run.altered and "later" in run.altered


def test_zero_and_cap_treat_every_suspect_run() -> None:
    zero, cap, keep = _scores("zero"), _scores("cap"), _scores("keep")
    assert {i for i in zero if zero[i] != keep[i]} == {REVIEWED, ABOVE_HUMANS}
    assert zero[REVIEWED] == zero[ABOVE_HUMANS] == 0.0
    assert cap[REVIEWED] == cap[ABOVE_HUMANS] == 1.0
    # A suspect is above 1.5x the best real human attempt in its environment (or zeroed later): no other
    # run of any environment is.
    data = load_paper(human_hours=None, hacks="keep")
    best = {e: max(a.score for a in data.attempts if a.is_human and a.env_id == e) for e in ENVS}
    above = {a.run_id for a in data.attempts if not a.is_human and a.score > 1.5 * best[a.env_id]}
    assert above == {REVIEWED, ABOVE_HUMANS}


def test_altered_runs_are_marked_in_tables_and_captions() -> None:
    from openrebench.analysis._figures import FIGURES
    from openrebench.analysis._tables import all_tables

    a = analyze(load_paper(), **FAST)
    tables = {t.key: t for t in all_tables(a)}
    assert any(row[0] == "o1-preview †" for row in tables["groups"].rows)
    assert "4.05 → 0.00" in tables["budget"].caption
    budget_row = next(r for r in tables["budget"].rows if r[0] == "o1-preview")
    assert "†" in budget_row[1] and "†" not in budget_row[3]  # 30-minute splits use the run, 2-hour ones not
    assert "4.05 → 0.00" in FIGURES["budget"][2](a)
    unaltered = analyze(load_paper(hacks="keep"), **FAST)
    assert not any("†" in row[0] for row in {t.key: t for t in all_tables(unaltered)}["groups"].rows)
    assert "no run altered" in FIGURES["budget"][2](unaltered)


def test_human_attempts_of_about_eight_hours_by_default_and_the_counts_per_environment() -> None:
    data = load_paper()
    humans = [a for a in data.attempts if a.is_human]
    assert len(humans) == 76 and all(7.0 <= (a.hours_used or 0) <= 9.0 for a in humans)
    counts = {c.env_id: (c.released, c.kept, c.too_short, c.too_long) for c in data.paper.human_counts}  # type: ignore[union-attr]
    assert counts == {"chat_rl": (11, 11, 0, 0), "fix_embedding": (16, 13, 1, 2),
                      "optimize_finetune": (16, 14, 1, 1), "optimize_kernel": (9, 9, 0, 0),
                      "restricted_mlm": (11, 9, 0, 2), "rust_codecontests": (13, 12, 0, 1),
                      "scaling_law": (10, 8, 2, 0)}
    every = [a for a in load_paper(human_hours=None).attempts if a.is_human]
    assert len(every) == 86 and max(a.hours_used or 0 for a in every) > 100
    short = [a for a in load_paper(human_hours=(0.0, 8.5)).attempts if a.is_human]
    assert len(short) == 79 and all((a.hours_used or 0) <= 8.5 for a in short)


def test_likely71_gives_every_environment_its_humans_and_their_score_at_k() -> None:
    data = load_paper("likely71", human_hours=None)
    humans = [a for a in data.attempts if a.is_human]
    by_env = {e: sum(a.env_id == e for a in humans) for e in ENVS}
    assert all(n > 0 for n in by_env.values()), by_env
    assert by_env["fix_embedding"] == 16 and by_env["scaling_law"] == 8  # their 'unknown' rows stand in
    assert len(humans) == 74
    a = analyze(data, **FAST)
    assert set(a.best_at(HUMAN_GROUP, 8.0).estimate.per_env) == set(ENVS)  # type: ignore[union-attr]
    assert len([x for x in load_paper("likely71").attempts if x.is_human]) == 69  # and 7 to 9 hours


def test_partial_coverage_is_reported_and_optionally_averaged_over_covered_environments() -> None:
    data = load_paper()
    a = analyze(data, **FAST)
    dropped = {(d.group, d.length_h): d for d in a.dropped}
    d = dropped[("Claude 3.5 Sonnet (New)", 0.5)]
    assert d.runs == 156 and d.missing == ["chat_rl", "fix_embedding", "restricted_mlm"]
    note = "Claude 3.5 Sonnet (New): 156 runs of 30 min left out of score@k"
    assert any(n.startswith(note) for n in a.notes)
    assert all(not x.partial for x in a.allocations)
    covered = analyze(data, coverage="covered", **FAST)
    assert not covered.dropped
    split = next(x for x in covered.allocations if x.group == "Claude 3.5 Sonnet (New)" and x.length_h == 0.5
                 and x.budget_h == 8.0)
    assert split.partial and split.environments == d.environments and "(4 envs)" in split.label
    sonnet = [x for x in data.attempts if x.group == "Claude 3.5 Sonnet (New)" and x.length_h == 0.5]
    by_env = {e: np.array([x.score for x in sonnet if x.env_id == e]) for e in d.environments}
    want = np.mean([v.mean() if e == "scaling_law" else expected_max(v, 16) for e, v in by_env.items()])
    assert split.estimate.exact == pytest.approx(want)
    # The humans it is compared with are those of the same four environments.
    human = next(h for h in covered.partial_humans if h.budget_h == 8.0 and h.environments == d.environments)
    people = {e: np.array([x.score for x in data.attempts if x.is_human and x.env_id == e])
              for e in d.environments}
    assert human.estimate.exact == pytest.approx(np.mean([v.mean() for v in people.values()]))


def test_the_alternatives_and_the_claims_follow_the_options() -> None:
    a = analyze_paper(**FAST)
    rows = {r.flags: r for r in a.alternatives or []}
    assert set(rows) == {"", "--hacks keep", "--hacks zero", "--hacks cap", "--human-hours all",
                         "--human-rows likely71", "--human-rows likely71 --human-hours all",
                         "--coverage covered"}
    head = {r.key: r for r in a.headline or []}
    assert rows[""].ratio_8h == pytest.approx(head["ratio_8h"].value)
    assert rows[""].humans == 76 and rows["--human-hours all"].humans == 86
    assert rows["--hacks keep"].altered == 0 and rows["--hacks zero"].altered == 2
    assert rows["--hacks keep"].ratio_8h > rows[""].ratio_8h  # the 4.05 run carries o1-preview's 8 hours
    claims = {c.key: c for c in a.claims or []}
    assert claims["ratio_2h"].verdict.startswith("not testable") and "lower bound" in claims["ratio_2h"].ours
    assert claims["ratio_32h_humans"].verdict == "reproduced"
    assert "--hacks keep" in claims["ratio_8h"].why and "--coverage covered" in claims["ratio_8h"].why
    keep = analyze_paper(hacks="keep", alternatives=False, **FAST)
    assert {c.key: c for c in keep.claims or []}["treatment"].ours == "--hacks keep"


# Broken data: a copy of the release, changed, read with --paper-data.

def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "release"
    folder.mkdir()
    for name in (HUMANS_FILE, AGENTS_FILE):
        with packaged_file(name).open("rb") as src, (folder / name).open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return folder


def _edit(path: Path, column: str | None = None, value: str | None = None, row: int = 0,
          drop: str | None = None) -> None:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    fields = [c for c in rows[0] if c != drop]
    if column is not None:
        rows[row][column] = value  # type: ignore[assignment]
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _break(folder: Path, how: str) -> None:
    agents, humans = folder / AGENTS_FILE, folder / HUMANS_FILE
    if how == "missing column":
        _edit(agents, drop="time_limit_hours")
    elif how == "non-numeric score":
        _edit(agents, "normalized_score", "high", row=4)
    elif how == "empty agent file":
        agents.write_bytes(b"")
    elif how == "header only":
        agents.write_text(agents.read_text().splitlines()[0] + "\n")
    elif how == "impossible time limit":
        _edit(agents, "time_limit_hours", "0", row=2)
    elif how == "infinite score":
        _edit(humans, "normalized_score", "inf", row=0)
    elif how == "negative hours":
        _edit(humans, "hours", "-8", row=1)
    elif how == "unknown status":
        _edit(humans, "status", "maybe", row=3)
    elif how == "unknown task":
        _edit(agents, "env", "ai_rd_nope", row=0)
    elif how == "duplicate run":
        with agents.open(encoding="utf-8") as f:
            lines = f.read().splitlines()
        agents.write_text("\n".join([*lines, lines[1]]) + "\n")
    elif how == "no later column":
        _edit(agents, drop=LATER_COLUMN)
    elif how == "missing file":
        humans.unlink()


BROKEN = [
    ("missing column", f"{AGENTS_FILE} lacks column(s) time_limit_hours"),
    ("non-numeric score", f"{AGENTS_FILE}:6: normalized_score 'high' is not a number"),
    ("empty agent file", f"{AGENTS_FILE} is empty (no header row)"),
    ("header only", f"{AGENTS_FILE} has a header but no rows"),
    ("impossible time limit", f"{AGENTS_FILE}:4: time_limit_hours '0' must be positive"),
    ("infinite score", f"{HUMANS_FILE}:2: normalized_score 'inf' is not a finite number"),
    ("negative hours", f"{HUMANS_FILE}:3: hours '-8' must be positive"),
    ("unknown status", f"{HUMANS_FILE}:5: unknown status 'maybe'"),
    ("unknown task", f"{AGENTS_FILE}:2: unknown RE-Bench task 'ai_rd_nope'"),
    ("duplicate run", "is given twice (also line 2)"),
    ("no later column", f"lacks column {LATER_COLUMN}, which says which runs METR zeroed"),
    ("missing file", f"{HUMANS_FILE} does not exist"),
]


@pytest.mark.parametrize(("how", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_release_data_gives_one_line_and_a_non_zero_exit(tmp_path: Path, how: str,
                                                                message: str) -> None:
    folder = _copy(tmp_path)
    _break(folder, how)
    result = CliRunner().invoke(app, ["analyze", "--paper", "--paper-data", str(folder), "--boots", "10",
                                      "--sims", "10"])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_an_intact_copy_reads_as_the_packaged_data_and_keep_needs_no_later_column(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    assert load_paper(data_dir=folder).attempts == load_paper().attempts
    _break(folder, "no later column")
    with pytest.raises(OpenRebenchError, match="use --hacks keep, zero or cap"):
        load_paper(data_dir=folder)
    assert len(load_paper(data_dir=folder, hacks="keep").attempts) == len(load_paper().attempts)


@pytest.mark.parametrize(("args", "message"), [
    (("--budgets", "nan"), "bad --budgets 'nan'"),
    (("--budgets", "inf"), "bad --budgets 'inf'"),
    (("--budgets", "0.1,0.3"), "no budget in 0.1, 0.3 h is a whole number of runs"),
    (("--max-budget", "-1"), "bad --max-budget -1"),
    (("--human-hours", "9-7"), "bad --human-hours '9-7'"),
    (("--human-hours", "eight"), "bad --human-hours 'eight'"),
    (("--human-hours", "0-1"), "no human attempts left in"),
    (("--hacks", "drop"), "unknown --hacks 'drop' (known: paper, keep, zero, cap)"),
    (("--coverage", "some"), "unknown --coverage 'some'"),
    (("--normalisation", "raw"), "unknown --normalisation 'raw'"),
    (("--paper-data", "NOWHERE"), "is not a folder"),
])
def test_bad_options_give_one_line(args: tuple[str, ...], message: str) -> None:
    result = CliRunner().invoke(app, ["analyze", "--paper", *args, "--boots", "10", "--sims", "10"])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
