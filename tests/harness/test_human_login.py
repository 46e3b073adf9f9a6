"""A person's login waits for the human agent's `task` command: Inspect prints the login command before its
service has written the module that command imports, and the login's .bashrc runs `task start` at once."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from openrebench.harness.backends._base import login_shell


def test_the_login_shell_starts_only_once_the_module_is_complete(tmp_path: Path) -> None:
    module = tmp_path / "human_agent.py"
    argv = login_shell((str(module), "def _human_agent_service_dir("))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    try:
        time.sleep(1.5)
        module.write_text("def call_human_agent(method):\n    pass\n")  # begun, not finished
        time.sleep(1.0)
        assert proc.poll() is None, "the shell started before the module was complete"
        module.write_text(module.read_text() + "def _human_agent_service_dir(subdir):\n    pass\n")
        out, _ = proc.communicate(timeout=10)  # a login shell with nothing on stdin ends at once
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "waiting for the task command to be ready..." in out  # said after 2 s of waiting


def test_without_a_condition_it_is_a_plain_login_shell() -> None:
    assert login_shell(None) == ["bash", "--login"]
