"""`openrebench analyze` and `openrebench report` on the paper's data, on real Inspect logs, and on both."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis_helpers import REAL_LOG, react_log
from openrebench.cli import app

runner = CliRunner()
FAST = ("--boots", "200", "--sims", "400")


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_analyze_paper_prints_the_headline_beside_the_published_numbers() -> None:
    code, out = invoke("analyze", "--paper")
    assert code == 0, out
    assert "The paper's headline numbers" in out
    for published in ("≈4×", "< 1 (humans", "≈2×", "0.64", "82%", "24%", "71 (61 experts)"):
        assert published in out
    assert "lower" in out and "hacks" in out  # cells wrap at the terminal's width
    assert "score@k against total time budget" in out and "o1-preview" in out


def test_analyze_paper_json_is_the_documented_model() -> None:
    code, out = invoke("analyze", "--paper", "--json", *FAST)
    assert code == 0, out
    data = json.loads(out)
    head = {row["key"]: row for row in data["headline"]}
    assert head["ratio_2h"]["published_value"] == 4.0 and head["ratio_2h"]["value"] < 4.0
    assert head["ratio_32h_humans"]["published_value"] == 2.0 and head["ratio_32h_humans"]["value"] > 1.0
    assert head["ratio_8h"]["value"] < 1.0  # humans ahead at 8 hours, as published
    assert head["human_mean"]["value"] == pytest.approx(0.61, abs=0.005)  # the 76 attempts of 7 to 9 hours
    assert all(row["citation"] for key, row in head.items() if row["published_value"] is not None)
    groups = {g["group"]: g for g in data["groups"]}
    assert groups["Human experts (paper)"]["runs"] == 76 and len(groups) == 9
    assert groups["o1-preview"]["kind"] == "paper agent" and groups["GPT-4o"]["kind"] == "release model"
    assert groups["o1-preview"]["altered"] == 1  # the paper's treatment: the run METR zeroed
    assert [c["key"] for c in data["claims"]] == ["ratio_2h", "ratio_8h", "ratio_32h_humans", "humans",
                                                  "treatment"]
    first = data["alternatives"][0]
    assert first["name"].endswith("this analysis") and first["flags"] == ""
    assert data["settings"]["environments"] == sorted(data["settings"]["environments"])
    humans32 = next(a for a in data["allocations"] if a["best"] and a["group"] == "Human experts (paper)"
                    and a["budget_h"] == 32)
    assert humans32["k"] == 4 and humans32["length_h"] == 8
    assert humans32["estimate"]["ci_low"] <= humans32["estimate"]["exact"] <= humans32["estimate"]["ci_high"]


def test_analyze_a_real_log_with_and_without_the_paper(tmp_path: Path) -> None:
    code, out = invoke("analyze", str(REAL_LOG), *FAST)
    assert code == 0, out
    assert "oracle (mini)" in out and "optimize_kernel" in out and "Human experts" not in out
    code, out = invoke("analyze", str(REAL_LOG), "--paper", "--json", *FAST)
    assert code == 0, out
    data = json.loads(out)
    assert data["settings"]["environments"] == ["optimize_kernel"]  # the paper's data cut to the logs' env
    groups = {g["group"] for g in data["groups"]}
    assert {"oracle (mini)", "Human experts (paper)", "o1-preview"} <= groups
    # A mini run is not set against the paper's humans (their tasks were full size): no ratio, no percentage.
    assert not any(c["agent"] == "oracle (mini)" for c in data["comparisons"])
    oracle = next(g for g in data["groups"] if g["group"] == "oracle (mini)")
    assert oracle["not_comparable"] == "tier mini" and oracle["cohort"] != "paper"
    assert any(c["agent"] == "o1-preview" and c["ratio"] for c in data["comparisons"])  # the paper's are
    assert data["headline"]  # the published comparison stays on all seven environments


def test_report_from_logs_and_paper_is_self_contained(tmp_path: Path) -> None:
    runs = react_log(tmp_path / "react.eval")
    out = tmp_path / "report.html"
    code, text = invoke("report", str(REAL_LOG), str(runs), "--paper", "--out", str(out), *FAST)
    assert code == 0, text
    page = out.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 6  # budget, against k, per environment, against humans, over time, cost
    assert "http://" not in page.replace("http://www.w3.org", "") and "<script" not in page
    for heading in ("This reproduction against the paper", "Headline", "How the data was read",
                    "score@k against total time budget", "score@k against the number of runs",
                    "Agents against human experts", "Score over time", "Score against cost",
                    "Our runs on both scales", "Methods", "Sources"):
        assert heading in page
    assert page.index("This reproduction against the paper") < page.index("<h2>Figures")
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)
    assert len(captions) == 6 and all(len(c) > 150 for c in captions)
    budget = html.unescape(captions[0])
    assert "starts at 8 h" in budget and "measured scale" in budget
    assert "not comparable with the paper's humans (tier mini)" in budget
    # The mini runs: tables of their own, and nowhere in the table of agents against the humans.
    text = html.unescape(page)
    assert "score@k against total time budget (best split per group): not comparable with the paper's " \
           "humans (tier mini)" in text
    humans = re.search(r'<table class="humans">.*?</table>', page, re.S)
    assert humans is not None and "o1-preview" in humans.group(0) and "(mini)</td>" not in humans.group(0)


def test_report_on_paper_alone_explains_missing_figures(tmp_path: Path) -> None:
    out = tmp_path / "paper.html"
    code, text = invoke("report", "--paper", "--out", str(out), *FAST)
    assert code == 0, text
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "No score logs in the data" in page and "No token, dollar or GPU-hour data" in page


@pytest.mark.parametrize(("args", "message"), [
    (("analyze",), "nothing to analyse"),
    (("analyze", "MISSING"), "does not exist"),
    (("analyze", "--paper", "--budgets", "two"), "bad --budgets 'two'"),
    (("analyze", "--paper", "--env", "nope"), "no attempts at environment(s) nope"),
    (("analyze", "--paper", "--human-rows", "all"), "unknown --human-rows 'all'"),
    (("report", "EMPTY"), "no Inspect logs (.eval or .json) in this directory"),
])
def test_bad_input_gives_one_clear_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "EMPTY").mkdir()
    args = tuple(str(tmp_path / a) if a in ("MISSING", "EMPTY") else a for a in args)
    code, out = invoke(*args)
    assert code == 1
    assert message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out


def test_odd_logs_never_give_a_traceback(tmp_path: Path) -> None:
    """A week-long run is longer than every default budget; a zero time limit is left out with
    --skip-incomplete; either way the output is tables or one line, never a traceback."""
    from analysis_helpers import write_variant

    def limit(seconds: int):  # type: ignore[no-untyped-def]
        def edit(log) -> None:  # type: ignore[no-untyped-def]
            log.eval.config.working_limit = seconds

        return edit

    week = write_variant(tmp_path / "week.eval", limit(7 * 24 * 3600))
    zero = write_variant(tmp_path / "zero.eval", limit(0))
    code, out = invoke("analyze", str(week), *FAST)
    assert code == 1 and "every run is longer than the largest budget (32 h; runs of 168 h)" in out
    assert len(out.strip().splitlines()) == 1, out
    code, out = invoke("analyze", str(week), "--max-budget", "168", *FAST)
    assert code == 0 and "Traceback" not in out, out
    code, out = invoke("analyze", str(zero), *FAST)
    assert code == 1 and "pass --skip-incomplete" in out and len(out.strip().splitlines()) == 1, out
    code, out = invoke("analyze", str(zero), str(REAL_LOG), "--skip-incomplete", *FAST)
    assert code == 0 and "zero.eval: left out" in " ".join(out.split()), out
