"""`openrebench eval` and the Inspect tasks: time limits checked in one line, the time the agent is told,
failures listed with a non-zero exit, and a log-viewing hint that works as printed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai.log import EvalError, EvalLog
from typer.testing import CliRunner

from analysis_helpers import real_log
from openrebench.api import ModelBudget, OpenRebenchError, describe_duration
from openrebench.cli import app
from openrebench.cli._common import duration
from openrebench.cli._eval_results import exit_code
from openrebench.cli._eval_results import failures as eval_failures
from openrebench.harness import TaskArgError, environment_tasks
from openrebench.harness.agents.react import system_prompt
from openrebench.runs import get_environment

RANGE = "1 minute to 7 days (60 to 604800 seconds)"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("limit", ["0", "0.001s", "59s", "1e9h", "-5m", "8d", "nan", "inf", "-inf"])
def test_time_limits_outside_a_minute_to_a_week_are_refused_in_one_line(tmp_path: Path, limit: str) -> None:
    code, out = invoke("eval", "optimize_kernel", "--time-limit", limit, "--log-dir", str(tmp_path / "logs"),
                       "--runs-dir", str(tmp_path / "runs"))
    assert code == 1, out
    assert f"error: --time-limit {limit} is out of range: use {RANGE}" in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
    assert not (tmp_path / "logs").exists() and not (tmp_path / "runs").exists()


def test_durations_take_units_and_the_range_ends() -> None:
    assert [duration(x) for x in ("60", "60s", "30m", "1.5h", "2h", "7d", " 90m ")] == \
        [60, 60, 1800, 5400, 7200, 604800, 5400]
    with pytest.raises(OpenRebenchError, match=re.escape("bad --time-limit 'soon' (use e.g. 90s, 30m, 2h")):
        duration("soon")


def test_a_gpu_tier_on_a_machine_without_gpus_fails_before_inspect_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.runs import _hardware

    cpu_only = _hardware.detect_hardware().model_copy(update={"gpu_count": 0, "gpu_model": None})
    monkeypatch.setattr(_hardware, "detect_hardware", lambda: cpu_only)
    code, out = invoke("eval", "optimize_kernel", "--tier", "full", "--log-dir", str(tmp_path / "logs"))
    assert code == 1
    assert "error: optimize_kernel: the full tier needs 1 CUDA GPU(s)" in " ".join(out.split())
    assert len(out.strip().splitlines()) == 1 and not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("args", "message"), [
    ({"time_limit": 0}, f"time_limit 0 is out of range: use {RANGE}"),
    ({"time_limit": "0.001"}, "time_limit 0.001 is out of range"),
    ({"time_limit": float("nan")}, "time_limit nan is out of range"),
    ({"time_limit": "inf"}, "time_limit inf is out of range"),
    ({"time_limit": 1e12}, "time_limit 1e+12 is out of range"),
    ({"time_limit": "30m"}, "time_limit '30m' is not a number of seconds"),
    ({"tier": "huge"}, "unknown tier 'huge' for optimize_kernel (known: mini, full)"),
    ({"agent": "gpt"}, "unknown agent 'gpt' (known: aide, human, modular, oracle, react)"),
    ({"isolation": "docker"}, "unknown isolation 'docker' (known: auto, bwrap, none)"),
])
def test_bad_task_args_give_one_line(args: dict[str, object], message: str) -> None:
    with pytest.raises(TaskArgError) as info:
        environment_tasks()["optimize_kernel"](**args)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert info.value.message == f"error: {info.value}"  # what `inspect eval` prints, without a traceback


@pytest.mark.slow
def test_inspect_eval_refuses_a_zero_time_limit_without_a_traceback(tmp_path: Path) -> None:
    inspect = Path(sys.executable).parent / "inspect"
    result = subprocess.run([str(inspect), "eval", "openrebench/optimize_kernel", "-T", "time_limit=0",
                             "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "error: time_limit 0 is out of range" in " ".join(out.split()) and "Traceback" not in out
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("seconds", "text"), [
    (60, "1 minute"), (1800, "30 minutes"), (5400, "90 minutes"), (7199, "120 minutes"), (7200, "2 hours"),
    (9000, "2.5 hours"), (28800, "8 hours"), (3600 * 24, "24 hours")])
def test_working_time_reads_in_minutes_under_two_hours_else_hours(seconds: float, text: str) -> None:
    assert describe_duration(seconds) == text


def test_the_agent_is_told_the_working_limit_inspect_enforces() -> None:
    task = environment_tasks()["optimize_kernel"](time_limit="1800")  # -T values may arrive as strings
    assert task.working_limit == 1800
    (sample,) = task.dataset
    assert "You have 30 minutes of working time" in str(sample.input) and "hours" not in str(sample.input)
    assert "You have 30 minutes of working time" in system_prompt("optimize_kernel", 1800)
    default = environment_tasks()["optimize_kernel"]()  # the tier's own limit, in hours from two hours up
    hours = get_environment("optimize_kernel").tier("mini").time_limit_hours
    assert hours >= 2 and default.working_limit == hours * 3600
    assert f"You have {hours:g} hours of working time" in str(default.dataset[0].input)


def test_every_environment_tells_its_agent_the_working_limit() -> None:
    for env_id, make in environment_tasks().items():
        (sample,) = make(time_limit=1800).dataset
        assert "30 minutes" in str(sample.input), env_id


def test_every_placeholder_of_every_instructions_is_filled_on_both_tiers() -> None:
    for env_id in environment_tasks():
        env = get_environment(env_id)
        for tier in env.tiers:
            assert not re.findall(r"\$[a-z_]+\b", env.instructions(tier)), (env_id, tier)


GRANTED = "openai/gpt-4o-mini"


@pytest.mark.parametrize(("env_id", "role"), [("rust_codecontests", "task_model"), ("chat_rl", "judge")])
def test_the_agent_is_told_the_models_and_budget_its_run_grants_not_the_tiers(env_id: str, role: str) -> None:
    spec = get_environment(env_id).tier("mini")
    default, budget = spec.models[role], spec.model_budget
    assert default.label and budget is not None and budget.tokens is not None
    (sample,) = environment_tasks()[env_id](time_limit=1800, model_budget_tokens="300k",
                                            **{role: GRANTED}).dataset
    text = " ".join(str(sample.input).split())
    assert f"({GRANTED})" in text and default.label not in text and "$model_" not in text
    assert "300,000 tokens" in text and f"{budget.tokens:,} tokens" not in text
    assert re.search(r"time limit is 30 minutes", text, re.I)
    (plain,) = environment_tasks()[env_id]().dataset  # no run settings: the tier's own
    text = " ".join(str(plain.input).split())
    assert f"({default.label})" in text and GRANTED not in text
    assert f"{budget.tokens:,} tokens" in text and re.search(r"time limit is 2 hours", text, re.I)


def test_a_tiers_reply_cap_holds_for_its_own_model_only_and_the_agent_is_told(tmp_path: Path) -> None:
    """rust_codecontests' mini tier cuts the offline model's replies (at 160 tokens), for the agent and each
    scoring; a run given another task model is not cut (what suits a small CPU model would hobble it),
    and a run's grant file written before the cap gets the cap of the models it names."""
    import json

    from openrebench.harness import RunModels
    from openrebench.runs import start_run

    env = get_environment("rust_codecontests")
    own = RunModels.for_tier(env, "mini")
    assert own is not None and own.scoring_budget is not None
    cap = env.tier("mini").model_budget.reply_tokens
    assert cap is not None and own.budget.reply_tokens == own.scoring_budget.reply_tokens == cap
    other = RunModels.for_tier(env, "mini", {"task_model": GRANTED})
    assert other is not None and other.scoring_budget is not None
    assert other.budget.reply_tokens is None and other.scoring_budget.reply_tokens is None
    scoring = f"{env.tier('mini').scoring_model_budget.tokens:,} tokens"  # each scoring's, told too
    (sample,) = environment_tasks()["rust_codecontests"]().dataset
    text = " ".join(str(sample.input).split())
    assert f"each reply at most {cap} tokens" in text
    assert f"{scoring} (each reply at most {cap} tokens: a longer one is cut there) for all the" in text
    (sample,) = environment_tasks()["rust_codecontests"](task_model=GRANTED).dataset
    text = " ".join(str(sample.input).split())
    assert "each reply at most" not in text and f"{scoring} for all the held-out" in text
    run, _ = start_run(env, "mini", tmp_path / "run", score_start=False)
    (run.path / "gateway").mkdir()
    for models, expected in (({"task_model": "local"}, cap), ({"task_model": GRANTED}, None)):
        (run.path / "gateway" / "grant.json").write_text(json.dumps(
            {"models": models, "budget": {"usd": None, "tokens": 2_000_000}}))  # no reply_tokens: older
        found = RunModels.of_run(run)
        assert found is not None and found.scoring_budget is not None
        assert (found.budget.reply_tokens, found.scoring_budget.reply_tokens) == (expected, expected), models


def test_a_granted_offline_model_and_a_dollar_budget_are_named_in_words() -> None:
    text = get_environment("rust_codecontests").instructions("full", models={"task_model": "local"},
                                                             budget=ModelBudget(usd=20))
    assert "(Gemma 3 270M, a small base model served offline as `local`)" in text and "gpt-3.5" not in text
    assert "share a budget of $20 for the whole attempt" in " ".join(text.split())


def test_eval_tells_the_agent_the_env_model_budget_and_time_limit_it_was_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through `openrebench eval`: what reaches Inspect's eval (replaced here by a recorder) is told of
    the `--env-model`, `--model-budget-*` and `--time-limit` values."""
    import inspect_ai

    seen: list[object] = []
    monkeypatch.setattr(inspect_ai, "eval", lambda tasks, **_: seen.extend(tasks) or [])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")  # the granted model is made, never called
    invoke("eval", "rust_codecontests", "--env-model", f"task_model={GRANTED}", "--model-budget-usd", "2.5",
           "--model-budget-tokens", "300k", "--time-limit", "45m", "--isolation", "none", "--log-dir",
           str(tmp_path / "logs"), "--runs-dir", str(tmp_path / "runs"))
    (task,) = seen
    text = " ".join(str(task.dataset[0].input).split())  # type: ignore[attr-defined]
    assert f"the **task model** ({GRANTED})" in text
    assert "share a budget of $2.50 or 300,000 tokens, whichever runs out first" in text
    assert "Your time limit is 45 minutes." in text


def test_the_runs_directory_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    task = environment_tasks()["optimize_kernel"](runs_dir="runs")
    assert task.sandbox is not None
    assert task.sandbox.config.runs_dir == str(tmp_path.resolve() / "runs")  # type: ignore[union-attr]


def _sample_error(log: EvalLog, message: str, traceback: str = "") -> None:
    log.samples[0].scores = None  # type: ignore[index]
    log.samples[0].error = EvalError(message=message, traceback=traceback, traceback_ansi="")  # type: ignore[index]


def test_a_successful_log_is_no_failure() -> None:
    assert eval_failures([real_log()], ["optimize_kernel"]) == [] and exit_code([]) == 0


def test_failed_and_unscored_samples_are_listed_even_in_a_successful_log() -> None:
    errored, unscored = real_log(), real_log()
    _sample_error(errored, "NotADirectoryError(20, 'Not a directory')",
                  "Traceback (most recent call last):\n  File ...\nNotADirectoryError: [Errno 20] Not a "
                  "directory: '/x/runs'\n")
    unscored.samples[0].scores = {}  # type: ignore[index]
    failures = eval_failures([errored, unscored], ["optimize_kernel"])
    assert failures == [
        ("optimize_kernel (epoch 1)", "error", "NotADirectoryError: [Errno 20] Not a directory: '/x/runs'"),
        ("optimize_kernel (epoch 1)", "unscored", "the sample was not scored")]
    assert exit_code(failures) == 1


def test_a_failed_eval_gives_its_reason_in_one_line() -> None:
    log = real_log()
    log.samples, log.status = [], "error"
    log.error = EvalError(message="OpenRebenchError('this environment needs 1 GPU(s); this machine shows 0')",
                          traceback="", traceback_ansi="")
    failures = eval_failures([log], ["optimize_kernel"])
    assert failures == [("optimize_kernel", "error",
                         "OpenRebenchError: this environment needs 1 GPU(s); this machine shows 0")]
    assert exit_code(failures) == 1


def test_an_interrupted_eval_exits_130() -> None:
    """On Ctrl-C Inspect returns no logs at all (it writes them cancelled), or a cancelled one."""
    assert eval_failures([], ["optimize_kernel"]) == [
        ("optimize_kernel", "cancelled", "interrupted (its log in --log-dir says how far it got)")]
    log = real_log()
    log.samples, log.status = [], "cancelled"
    failures = eval_failures([log], ["optimize_kernel"])
    assert failures == [("optimize_kernel", "cancelled", "interrupted")] and exit_code(failures) == 130


@pytest.mark.slow
def test_a_failing_eval_exits_1_lists_the_failure_and_a_working_view_command(tmp_path: Path) -> None:
    """The run directory cannot be made (runs dir is a file): the sample fails at set-up, through Inspect."""
    (tmp_path / "runs").write_text("not a directory")
    logs = tmp_path / "logs"
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--log-dir", str(logs), "--runs-dir",
                                      str(tmp_path / "runs"), "--display", "none"])
    out = result.output
    assert result.exit_code == 1, out
    assert (f"error: optimize_kernel (epoch 1): OpenRebenchError: {tmp_path / 'runs'} is a file, not a "
            "directory: a run cannot go under it") in out
    inspect = Path(sys.executable).parent / "inspect"
    assert f"`{inspect} view --log-dir {logs}`" in out
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(logs))
    assert read_eval_log(info).eval.model == "none/none"  # the oracle uses no model, and the log says so


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_view_runs_the_venv_inspect_on_logs_demo() -> None:
    root = Path(__file__).parents[2]
    for extra, log_dir in (([], "logs/demo"), (["LOG_DIR=logs/x"], "logs/x")):
        out = subprocess.run(["make", "-n", "view", *extra], capture_output=True, text=True, cwd=root).stdout
        assert f".venv/bin/inspect view --log-dir {log_dir}" in out


def test_the_caption_of_a_campaign_names_every_time_limit() -> None:
    from types import SimpleNamespace

    from openrebench.harness import results_caption

    def log(task: str, limit: float) -> SimpleNamespace:
        return SimpleNamespace(eval=SimpleNamespace(task=task, metadata={}, config=SimpleNamespace(
            working_limit=limit)))

    text = results_caption([log("optimize_kernel", 1800), log("optimize_kernel", 7200)])
    limits = "no message limit, no token limit"
    assert text == (f"optimize_kernel: per attempt: 30 min working time, {limits}; optimize_kernel: per "
                    f"attempt: 2 h working time, {limits}")
    assert results_caption([log("a", 60), log("b", 60)]) == f"per attempt: 1 min working time, {limits}"
