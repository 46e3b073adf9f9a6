"""The optimize_kernel freezer pauses a whole process tree, threads included, and resumes it."""

from __future__ import annotations

import subprocess
import sys
import time

from openrebench.environments.optimize_kernel._freeze import Freezer

TREE = """
import os, threading, time
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:  # a child that forks a grandchild, both busy
    os.fork()
    spin()
print("ready", flush=True)
spin()
"""


def _states(pids: list[int]) -> set[str]:
    states = set()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            states.add(f.read().rsplit(")", 1)[1].split()[0])
    return states


def test_freeze_resume_and_kill_a_busy_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        freezer = Freezer(proc.pid)
        assert not freezer.namespace  # pytest runs outside the scorer's PID namespace: the session
        deadline = time.monotonic() + 10
        while len(freezer.processes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = freezer.processes()
        assert len(pids) == 3 and proc.pid in pids
        freezer.freeze()
        assert _states(pids) == {"T"}
        time.sleep(0.1)
        assert _states(pids) == {"T"}
        freezer.resume()
        time.sleep(0.2)
        assert "T" not in _states(pids)
        freezer.freeze()
        freezer.kill_all()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while freezer.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_states([p]) <= {"Z"} for p in freezer.processes())
    finally:
        proc.kill()
        proc.wait()
