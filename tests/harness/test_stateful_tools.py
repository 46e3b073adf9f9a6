"""Inspect's stateful tools in the attempt's long-lived sandbox, driven by the react agent through a real mini
environment: `bash_session` keeps its shell (directory, variables, jobs) between calls, `text_editor`
edits files as the agent, `exec_remote` runs background jobs, and a job started in one call is seen
running in the next."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, get_model

from openrebench.harness import environment_tasks
from openrebench.isolation import bwrap_binary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")]


def _call(tool: str, **arguments: object) -> ModelOutput:
    return ModelOutput.for_tool_call("mockllm/model", tool, arguments)


def test_react_keeps_a_shell_and_background_jobs_between_tool_calls(tmp_path: Path) -> None:
    outputs = [
        _call("bash_session", action="type_submit",
              input="cd /tmp && export ANSWER=42 && (nohup sleep 300 >/dev/null 2>&1 &) && echo started"),
        _call("bash_session", action="type_submit", input="echo \"dir=$(pwd) answer=$ANSWER\""),
        _call("text_editor", command="create", path="/workspace/notes.md", file_text="first line\n"),
        _call("text_editor", command="str_replace", path="/workspace/notes.md", old_str="first",
              new_str="edited"),
        _call("bash",
              command="cat /workspace/notes.md; stat -c %U /workspace/notes.md; pgrep -x sleep | wc -l"),
        _call("submit", answer="done"),
    ]
    task = environment_tasks()["example_fit"](tier="mini", agent="react", runs_dir=str(tmp_path / "runs"),
                                              time_limit=600)
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs),
                          log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples or []
    results = [m for m in sample.messages if m.role == "tool"]
    texts = [m.text for m in results]
    errors = [m.error.message for m in results if m.error]
    assert not errors, errors
    assert "started" in texts[0]
    assert "dir=/tmp answer=42" in texts[1]  # the same shell, its directory and variable kept
    bash_out = texts[4].split()
    assert bash_out[:3] == ["edited", "line", "agent"]  # the editor wrote as the agent
    assert int(bash_out[3]) >= 1  # the job from the first call still runs, seen from another tool


def test_exec_remote_runs_a_background_job_in_the_sandbox(tmp_path: Path) -> None:
    """Inspect's exec_remote (a job in the sandbox's tool server, streamed back) works in the long-lived
    sandbox: it is started, and its output arrives."""
    import asyncio

    from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy

    from openrebench.harness import OpenRebenchSandbox, SandboxConfig
    from openrebench.runs import start_run

    run = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)[0]

    async def scenario() -> tuple[str, int]:
        box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel"))
        try:
            # As Inspect wraps every sample's sandbox (exec_remote's polling relies on the wrapper).
            proxy = SandboxEnvironmentProxy(box)
            result = await proxy.exec_remote(["sh", "-c", "echo one; sleep 1; echo two"], stream=False)
            return result.stdout, result.returncode
        finally:
            await box.close()

    out, code = asyncio.run(scenario())
    assert code == 0 and out.split() == ["one", "two"]
