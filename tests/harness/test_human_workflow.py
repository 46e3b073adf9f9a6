"""A person's attempt at the paper's scale, walked through as an expert would: several terminals on one
sandbox, tmux surviving a dropped connection, a paused clock that the scorings' working time honours, and
an attempt interrupted by a crash of the harness, then continued (`--resume`) with its workspace and its
charged time."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openrebench.isolation import bwrap_binary
from terminal_support import Terminal

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bwrap_binary() is None or shutil.which("tmux") is None,
                                                   reason="needs bubblewrap and tmux")]

HUMAN_EVAL = """
import sys
from inspect_ai import eval as inspect_eval
from openrebench.harness import environment_tasks
task = environment_tasks()["example_fit"](tier="mini", agent="human", runs_dir=sys.argv[1] + "/runs",
                                          time_limit=1800)
(log,) = inspect_eval(task, model="none", log_dir=sys.argv[1] + "/logs", display="plain")
print("STATUS", log.status)
"""
PROMPT = r"agent:/workspace\$ "


def _harness(folder: Path, resume: bool) -> tuple[subprocess.Popen[bytes], str]:
    out = folder / f"eval-{int(resume)}.out"
    env = {**os.environ, "OPENREBENCH_RESUME": "1" if resume else "0"}
    proc = subprocess.Popen([sys.executable, "-u", "-c", HUMAN_EVAL, str(folder)], stdout=out.open("w"),
                            stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"(/\S+/login)\s", out.read_text())
        if found:
            return proc, found.group(1)
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(out.read_text()[-3000:])


def _login(login: str) -> Terminal:
    term = Terminal([login])
    term.expect(PROMPT)
    return term


def _run(term: Terminal, command: str, timeout: float = 60) -> str:
    term.send(command + "\n")
    return term.expect(r"(?s)(.*?)" + PROMPT, timeout=timeout).group(1)


def _run_dir(folder: Path) -> Path:
    (run,) = [p for p in (folder / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    return run


def _started(row: dict) -> float:
    """When a scoring started, on the wall clock (its row is written when it ends)."""
    from datetime import datetime

    return datetime.fromisoformat(row["timestamp"]).timestamp() - float(row["duration_s"])


def _rows(folder: Path) -> list[dict]:
    run = _run_dir(folder)
    return [json.loads(line) for line in (run / "score_log.jsonl").read_text().splitlines()]


def test_an_expert_attempt_with_terminals_tmux_a_pause_and_a_resumed_crash(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    proc, login = _harness(tmp_path, resume=False)
    try:
        first = _login(login)
        _run(first, "tmux new -d -s work 'while true; do date +%s >> /tmp/ticks; sleep 1; done'")
        _run(first, "echo 'my notes' > /workspace/notes.txt")
        second = _login(login)  # a second terminal, the same machine
        assert "work:" in _run(second, "tmux ls")
        first.close()  # the connection drops
        time.sleep(3)
        third = _login(login)
        ticks = int(_run(third, "wc -l < /tmp/ticks").split()[-1])
        time.sleep(2)
        assert int(_run(third, "wc -l < /tmp/ticks").split()[-1]) > ticks  # still running, still ticking
        assert "tmux: 1 windows" in _run(third, "tmux ls | sed 's/work:/tmux:/'")

        _run(third, "score", timeout=300)
        _run(third, "task stop")
        time.sleep(5)
        _run(third, "task start")
        _run(third, "score", timeout=300)
        first_row, second_row = _rows(tmp_path)[-2:]
        charged = second_row["elapsed_s"] - first_row["elapsed_s"]  # each taken as its scoring started
        wall = _started(second_row) - _started(first_row)
        assert charged < wall - 4, (charged, wall)  # the 5 s paused were not charged
        second.close()
        third.close()
    finally:
        proc.send_signal(signal.SIGKILL)  # the harness crashes
        proc.wait()
    charged = _rows(tmp_path)[-1]["elapsed_s"]

    proc, login = _harness(tmp_path, resume=True)
    try:
        term = _login(login)
        assert "my notes" in _run(term, "cat /workspace/notes.txt")  # the same workspace
        _run(term, "score", timeout=300)
        rows = _rows(tmp_path)
        assert [r["kind"] for r in rows] == ["setup", "score", "score", "score"]  # the same run, continued
        assert rows[-1]["elapsed_s"] >= charged  # its clock went on from the charged time
        term.send("task submit\n")
        term.expect(r"Yes \(y\) or No \(n\)")
        term.send("y\n")
        assert proc.wait(timeout=120) == 0
        term.close()
    finally:
        proc.kill()
    run = _run_dir(tmp_path)
    record = json.loads((run / "attempt.json").read_text())
    assert record["state"] == "ended" and record["resumed"] == 1
