"""The Inspect harness end to end: a scripted agent (mockllm) and the oracle, through the sandbox."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, get_model

from kernel_support import write_reference_code
from openrebench.harness import environment_tasks
from openrebench.isolation import bwrap_binary
from openrebench.runs import Run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")]


def test_scripted_agent_scores_broken_then_reference(tmp_path: Path) -> None:
    write_reference = write_reference_code()
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash",
                                  {"command": "printf 'def prefix_sum(x):\\n    return x\\n' > solution.py"}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "python", {"code": write_reference}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}),
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = environment_tasks()["optimize_kernel"](tier="mini", agent="react", runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    tool_results = [m.text for m in sample.messages if m.role == "tool"]
    assert any("Invalid: wrong output" in t for t in tool_results), tool_results
    score = sample.scores["rebench_scorer"]
    rows = score.metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score", "score"]
    assert rows[1]["raw"] is None and rows[2]["raw"] is not None
    assert score.value >= 0.5  # ≈ 1 on a quiet machine; timing on a busy one costs some of it
    assert score.metadata["fingerprint"]["env_id"] == "optimize_kernel"
    paper = score.metadata["paper_constants"]  # the score on the paper's scale, beside the measured one
    gap = paper["reference"] - paper["start"]
    start = score.metadata["fingerprint"]["constants"]["start"]
    assert score.metadata["normalised_paper"] == pytest.approx(max(0.0, (rows[2]["raw"] - start) / gap))
    assert rows[2]["normalised_paper"] == pytest.approx(score.metadata["normalised_paper"])
    assert list((tmp_path / "logs").glob("*.eval"))


def test_oracle_through_openrebench_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `make demo` runs it: relative log and runs directories."""
    from typer.testing import CliRunner

    from openrebench.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")  # a row per attempt, unwrapped, for the checks below
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--log-dir", "logs/demo", "--runs-dir",
                                      "runs/demo"])
    assert result.exit_code == 0, result.output
    assert "optimize_kernel" in result.output and "Inspect logs" in result.output
    assert "Estimate" not in result.output  # no cost estimate for the oracle
    text = " ".join(result.output.split())
    # The task's own time, set-up and scorings included (over a minute on a busy machine: "1 min 01 s").
    assert re.search(r"agent done │ (\d+ min )?\d+ s │", text), text
    assert re.search(r"Total: 1 task in (\d+ min )?\d+ s \(set-ups, attempts and scorings", text), text
    # where the normalisation's constants come from (this machine's record, another's, or the default)
    assert re.search(r"optimize_kernel normalised with: (local|shipped) calibration on cpu:|optimize_kernel "
                     r"normalised with: .*no calibration for cpu:", text), text
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(tmp_path / "logs" / "demo"))
    log = read_eval_log(info)
    # The reference was installed and scored (the start is 0); how close to 1 depends on the machine's load.
    assert log.results.scores[0].metrics["mean"].value > 0.5
    (run_dir,) = (tmp_path / "runs" / "demo").iterdir()
    assert all(r.valid for r in Run.open(run_dir).rows()[0])


def test_inspect_eval_as_the_readme_writes_it(tmp_path: Path) -> None:
    """`inspect eval openrebench/<env>` from a fresh folder: its default runs directory is relative."""
    inspect = Path(sys.executable).parent / "inspect"
    proc = subprocess.run([str(inspect), "eval", "openrebench/optimize_kernel", "-T", "tier=mini", "--model",
                           "none", "--log-dir", "logs", "--display", "plain"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows, _ = Run.open(run_dir).rows()
    assert rows and all(r.valid for r in rows), rows
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(tmp_path / "logs"))
    assert read_eval_log(info).results.scores[0].metrics["mean"].value > 0.5


HUMAN_EVAL = """
import sys
from inspect_ai import eval as inspect_eval
from openrebench.harness import environment_tasks
task = environment_tasks()["example_fit"](tier="mini", agent="human", runs_dir=sys.argv[1] + "/runs")
(log,) = inspect_eval(task, model="none", log_dir=sys.argv[1] + "/logs", display="plain")
print("STATUS", log.status)
"""


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux `script` for a terminal")
def test_human_agent_logs_in_scores_and_submits(tmp_path: Path) -> None:
    """A person's path: Inspect's human agent prints a login command; in that shell `score` asks the
    harness to score and `task submit` ends the attempt, whose log then holds the scoring."""
    import re
    import subprocess
    import sys
    import time

    from terminal_support import Terminal

    out = (tmp_path / "eval.out").open("w+")
    proc = subprocess.Popen([sys.executable, "-u", "-c", HUMAN_EVAL, str(tmp_path)], stdout=out,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        login = None
        while login is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            found = re.search(r"(/\S+/login)\s", Path(out.name).read_text())
            login = found.group(1) if found else None
        assert login, Path(out.name).read_text()[-3000:]
        term = Terminal([login])
        term.expect(r"agent:/workspace\$ ")
        term.send("score\n")
        scored = term.expect(r"score ln\(MSE\)[^\n]*", timeout=300).group(0)
        term.expect(r"agent:/workspace\$ ")
        term.send("task submit\n")
        term.expect(r"Yes \(y\) or No \(n\)", timeout=60)
        term.send("y\n")
        assert proc.wait(timeout=120) == 0, Path(out.name).read_text()[-3000:]
        term.close()
    finally:
        proc.kill()
    assert "STATUS success" in Path(out.name).read_text()
    assert "score ln(MSE)" in scored
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(tmp_path / "logs"))
    (sample,) = read_eval_log(info).samples
    rows = sample.scores["rebench_scorer"].metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score"]
