"""The agent's model cost and, kept apart, the environment's own model calls (the gateway's totals in a
sample's score metadata), read from synthetic logs into `analyze`'s tables and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis_helpers import gateway_usage, runs_log, write_variant
from openrebench.analysis import analyze, load_logs
from openrebench.analysis._tables import all_tables
from openrebench.cli import app

FAST = ("--boots", "50", "--sims", "50")
JUDGE = gateway_usage(4, 3000, 200, 0.0125, failures=1, roles={"judge": (3, 2000, 150, 0.01),
                                                               "task_model": (1, 1000, 50, 0.0025)})


def _log(tmp_path: Path, gateway: list[dict | None] | None, model: str = "openai/gpt-4o",
         cost: float | None = 0.5) -> Path:
    return runs_log(tmp_path / f"{len(list(tmp_path.glob('*.eval')))}.eval", agent="react", model=model,
                    hours=0.5, tokens=10_000, cost=cost, runs=[[(0.1, 0.2)], [(0.2, 0.4)]], gateway=gateway)


def test_the_gateway_totals_are_read_apart_from_the_agents_usage(tmp_path: Path) -> None:
    data = load_logs([_log(tmp_path, [JUDGE, None])])
    used, unused = data.attempts
    assert (used.tokens, used.cost_usd) == (10_000, 0.5)  # the agent's, from Inspect's usage
    assert used.env_models is not None and used.env_models.tokens == 3200
    assert used.env_models.cost_usd == pytest.approx(0.0125) and used.env_models.failures == 1
    assert set(used.env_roles) == {"judge", "task_model"} and used.env_roles["judge"].requests == 3
    assert unused.env_models is None and unused.env_roles == {} and not data.warnings

    result = analyze(data, boots=20, sims=20)
    (group,) = result.groups
    assert group.cost_per_run_usd == pytest.approx(0.5)
    assert group.env_tokens_per_run == pytest.approx(1600)  # a run without gateway use counts as none
    assert group.env_cost_per_run_usd == pytest.approx(0.00625)
    rows = {r.role: r for r in result.env_models}
    assert rows[None].runs == 1 and rows[None].usage.requests == 4
    assert rows["judge"].usage.input_tokens == 2000
    assert rows["task_model"].usage.cost_usd == pytest.approx(0.0025)
    assert result.cost and all(c.env_dollars is not None for c in result.cost)


def test_the_providers_spelling_and_an_unpriced_model_are_understood(tmp_path: Path) -> None:
    raw = {"total": {"prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0, "requests": 2,
                     "failures": 0, "priced": False, "tokens": 15},
           "roles": {"judge": {"prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0, "requests": 2,
                               "failures": 0, "priced": False}}, "phases": {}}
    (attempt, _) = load_logs([_log(tmp_path, [raw, None])]).attempts
    assert attempt.env_models is not None
    assert (attempt.env_models.input_tokens, attempt.env_models.output_tokens) == (10, 5)
    assert attempt.env_models.cost_usd is None  # a model without a price: the dollars are unknown
    result = analyze(load_logs([tmp_path]), boots=20, sims=20)
    assert result.groups[0].env_tokens_per_run == pytest.approx(7.5)
    assert result.groups[0].env_cost_per_run_usd is None


@pytest.mark.parametrize("bad", ["lots", {"roles": {}}, {"total": {"requests": -1}},
                                 {"total": {"requests": 1, "input_tokens": "many"}}])
def test_a_malformed_record_is_left_out_with_a_warning(tmp_path: Path, bad: object) -> None:
    data = load_logs([_log(tmp_path, [bad, None])])  # type: ignore[list-item]
    assert all(a.env_models is None for a in data.attempts)
    (warning,) = data.warnings
    assert "'gateway_usage' has no readable total" in warning
    assert analyze(data, boots=20, sims=20).env_models == []


def test_without_gateway_use_no_environment_model_columns_appear(tmp_path: Path) -> None:
    result = analyze(load_logs([_log(tmp_path, None)]), boots=20, sims=20)
    assert result.groups[0].env_tokens_per_run is None and result.env_models == []
    tables = {t.key: t for t in all_tables(result, full=True)}
    assert "env_models" not in tables
    columns = tables["groups"].columns
    assert "agent $ / run" in columns and "env models $ / run" not in columns


def test_the_agents_cost_comes_from_the_price_table_when_the_log_has_none(tmp_path: Path) -> None:
    listed = load_logs([_log(tmp_path, None, cost=None)])
    assert listed.attempts[0].cost_usd == pytest.approx((5000 * 2.5 + 5000 * 10.0) / 1e6)  # list prices
    assert any("openai/gpt-4o" in n and "list prices of" in n for n in listed.notes)
    local = load_logs([_log(tmp_path, None, model="openai-api/local/gemma-3-270m", cost=None)])
    assert local.attempts[0].cost_usd == 0.0 and not local.notes  # the offline model runs here: free
    unknown = load_logs([_log(tmp_path, None, model="openai-api/x/mystery", cost=None)])
    assert unknown.attempts[0].cost_usd is None


def test_analyze_and_report_show_both_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.cli import _common

    monkeypatch.setattr(_common.console, "width", 250)  # every column's header on one line
    log = _log(tmp_path, [JUDGE, None])
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", str(log), *FAST], terminal_width=250)
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("agent $ / run", "env models $ / run", "$0.50", "1,600", "The environments' own models",
                 "judge", "task_model", "all roles", "3,000"):
        assert text in out, text
    data = json.loads(runner.invoke(app, ["analyze", str(log), "--json", *FAST]).output)
    assert data["groups"][0]["env_cost_per_run_usd"] == pytest.approx(0.00625)
    assert {r["role"] for r in data["env_models"]} == {None, "judge", "task_model"}

    page = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(log), "--out", str(page), *FAST])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert 'id="table-env_models"' in html and "env models $" in html and "agent $ / run" in html


def test_an_old_log_without_the_key_reads_as_before(tmp_path: Path) -> None:
    log = write_variant(tmp_path / "old.eval", lambda log: None)
    (attempt,) = load_logs([log]).attempts
    assert attempt.env_models is None and attempt.cost_usd == 0.0
