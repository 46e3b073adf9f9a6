"""The Inspect harness end to end: a scripted agent (mockllm) and the oracle, through the sandbox."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, get_model

from openrebench.environments import get_environment
from openrebench.harness import TASKS
from openrebench.harness._bwrap import bwrap_binary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")]


def test_scripted_agent_scores_broken_then_reference(tmp_path: Path) -> None:
    reference = (get_environment("optimize_kernel").root / "reference" / "solution.py").read_bytes()
    write_reference = (f"import base64\nopen('/workspace/solution.py', 'wb').write("
                       f"base64.b64decode('{base64.b64encode(reference).decode()}'))\n")
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash",
                                  {"command": "printf 'def prefix_sum(x):\\n    return x\\n' > solution.py"}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "python", {"code": write_reference}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}),
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = TASKS["optimize_kernel"](tier="mini", agent="react", runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    tool_results = [m.text for m in sample.messages if m.role == "tool"]
    assert any("Invalid: wrong output" in t for t in tool_results), tool_results
    score = sample.scores["run_score"]
    rows = score.metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score", "score"]
    assert rows[1]["raw"] is None and rows[2]["raw"] is not None
    assert score.value >= 0.9
    assert score.metadata["fingerprint"]["env_id"] == "optimize_kernel"
    assert list((tmp_path / "logs").glob("*.eval"))


def test_oracle_through_openrebench_eval(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from openrebench.cli import app

    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--log-dir", str(tmp_path / "logs"),
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "optimize_kernel" in result.output and "Inspect logs" in result.output
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(tmp_path / "logs"))
    log = read_eval_log(info)
    assert log.results.scores[0].metrics["mean"].value >= 0.9
