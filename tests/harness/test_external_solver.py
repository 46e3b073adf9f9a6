"""A solver of the user's own (`inspect eval --solver`, `openrebench eval --solver`) gets the
environment's instructions as its input and the `score` and `score_log` tools in the state's tools,
and its scorings land in the run's score log; the built-in react agent is offered them once."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import ModelOutput, get_model
from inspect_ai.solver import basic_agent
from typer.testing import CliRunner

from openrebench.analysis import load_logs
from openrebench.cli import app
from openrebench.harness import environment_tasks
from openrebench.isolation import bwrap_binary

needs_bwrap = pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")

# A solver in a file of the user's, as `--solver FILE.py@score_once` names it: no model, no tools of its
# own; it calls the `score` tool it finds in the state and answers with what the tool said.
SCORE_ONCE = '''
from inspect_ai.solver import solver
from inspect_ai.tool import ToolDef


@solver
def score_once():
    async def solve(state, generate):
        assert "solution.py" in state.input_text, state.input_text  # the environment's instructions
        tools = {ToolDef(t).name: t for t in state.tools}
        state.output.completion = f"tools={sorted(tools)}; " + await tools["score"]()
        return state

    return solve
'''


def offered_tools(log: EvalLog) -> list[list[str]]:
    """The tool names the model was offered, per model call."""
    (sample,) = log.samples or []
    return [[t.name for t in e.tools] for e in sample.events if e.event == "model"]


def test_a_solver_with_another_agent_named_is_refused() -> None:
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--solver", "x.py@y", "--agent", "react",
                                      "--model", "mockllm/model"])
    assert result.exit_code == 1
    assert "--solver runs on one machine, in place of --agent: leave out --agent" in result.output


@pytest.mark.slow
@needs_bwrap
def test_inspects_basic_agent_with_no_tools_of_its_own_scores_through_the_state_tools(
        tmp_path: Path) -> None:
    outputs = [ModelOutput.for_tool_call("mockllm/model", "score", {}),
               ModelOutput.for_tool_call("mockllm/model", "score_log", {}),
               ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"})]
    task = environment_tasks()["example_fit"](tier="mini", runs_dir=str(tmp_path / "runs"))
    model = get_model("mockllm/model", custom_outputs=outputs)
    (log,) = inspect_eval(task, solver=basic_agent(), model=model, log_dir=str(tmp_path / "logs"),
                          display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples or []
    assert "solution.py" in sample.messages[1].text  # the instructions, after basic_agent's system prompt
    tool_results = {m.function: m for m in sample.messages if m.role == "tool"}
    assert tool_results["score"].error is None and "Valid: mean squared error" in tool_results["score"].text
    assert tool_results["score_log"].error is None and "#1 " in tool_results["score_log"].text
    offered = offered_tools(log)
    assert len(offered) == 3 and all(sorted(names) == ["score", "score_log", "submit"] for names in offered)
    rows = sample.scores["rebench_scorer"].metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score"] and rows[1]["raw"] is not None
    (attempt,) = load_logs([tmp_path / "logs"]).attempts  # the analysis names the solver that ran
    assert attempt.scaffold == "inspect_ai/basic_agent" and attempt.group.startswith("inspect_ai/basic_agent")


@pytest.mark.slow
@needs_bwrap
def test_openrebench_eval_runs_a_solver_from_a_file_with_the_score_tools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_agent.py").write_text(SCORE_ONCE)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", "example_fit", "--solver", "my_agent.py@score_once",
                                      "--log-dir", "logs", "--runs-dir", "runs"])
    assert result.exit_code == 0, result.output
    assert "my_agent.py@score_once on mini" in result.output
    (path,) = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(path))
    assert log.eval.metadata["agent"] == "my_agent.py@score_once"  # what the analysis groups by
    (sample,) = log.samples or []
    assert sample.output.completion.startswith("tools=['score', 'score_log']; ")
    rows = sample.scores["rebench_scorer"].metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score"] and rows[1]["raw"] is not None


@pytest.mark.slow
@needs_bwrap
def test_the_builtin_react_agent_is_offered_the_score_tools_once(tmp_path: Path) -> None:
    outputs = [ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"})]
    task = environment_tasks()["example_fit"](tier="mini", agent="react", runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs),
                          log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (names,) = offered_tools(log)
    assert names.count("score") == 1 and names.count("score_log") == 1, names
