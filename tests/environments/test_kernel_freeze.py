"""The optimize_kernel freezer pauses every process a solution started, in its cgroup, and nothing the
solution does undoes the pause: a SIGCONT from a process of its own, a daemon that left the session or
double-forked, a thread that keeps working (class 2 of the threat model: one freezing mechanism, the
cgroup freezer)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from openrebench.api import SolutionProcess
from openrebench.environments.optimize_kernel._freeze import Freezer
from openrebench.isolation import Cgroup

# Every process counts in a file of its own; the daemon keeps sending SIGCONT to everyone it can see.
TREE = """
import os, signal, sys, threading, time
folder = sys.argv[1]

def count(name):
    i = 0
    while True:
        i += 1
        # Replaced whole, never truncated in place: a reader must not catch an empty file mid-write.
        with open(os.path.join(folder, name + ".new"), "w") as f:
            f.write(str(i))
        os.replace(os.path.join(folder, name + ".new"), os.path.join(folder, name))
        time.sleep(0.01)

threading.Thread(target=count, args=("thread",), daemon=True).start()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # a daemon: another session, re-parented, waking everyone it can
        threading.Thread(target=count, args=("daemon",), daemon=True).start()
        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    os.kill(int(pid), signal.SIGCONT)
                except OSError:
                    pass
            time.sleep(0.005)
    os._exit(0)
count("main")
"""


def _counts(folder: Path) -> dict[str, int]:
    out = {}
    for name in ("main", "thread", "daemon"):
        try:
            out[name] = int((folder / name).read_text() or 0)
        except (OSError, ValueError):
            out[name] = -1
    return out


def test_the_cgroup_freezer_holds_against_everything_the_solution_does(tmp_path: Path) -> None:
    group = Cgroup.create("freeze-test", memory_bytes=None, max_pids=None)
    if group is None or not group.can_freeze:
        pytest.skip("no cgroup freezer here")
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen(["/bin/sh", "-c", 'read -r _ && exec "$@"', "gate", sys.executable, str(script),
                             str(tmp_path)], stdin=subprocess.PIPE, start_new_session=True)
    try:
        group.add(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        deadline = time.monotonic() + 20
        while min(_counts(tmp_path).values()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert min(_counts(tmp_path).values()) >= 5, _counts(tmp_path)
        freezer = Freezer(group)
        assert len(freezer.processes()) >= 2  # the main process and the daemon, both in the group
        freezer.freeze()
        frozen = _counts(tmp_path)
        time.sleep(0.5)
        assert _counts(tmp_path) == frozen  # nothing moved: not the thread, not the daemon's SIGCONTs
        freezer.resume()
        time.sleep(0.3)
        later = _counts(tmp_path)
        assert all(later[k] > frozen[k] for k in frozen), (frozen, later)
        freezer.kill_all()
        assert group.wait_empty(10)
    finally:
        proc.kill()
        proc.wait()
        group.close()


def test_a_solution_host_is_in_its_cgroup_before_any_code_of_its_own_runs(tmp_path: Path) -> None:
    group = Cgroup.create("host-test", memory_bytes=None, max_pids=None)
    if group is None:
        pytest.skip("no cgroup here")
    try:
        # The module runs as the host (found on the scorer's import path, not in the solution's folder):
        # its first act is to say which cgroup it is in.
        modules, solution = tmp_path / "modules", tmp_path / "solution"
        modules.mkdir()
        solution.mkdir()
        (modules / "probe_host.py").write_text("print(open('/proc/self/cgroup').read(), flush=True)\n")
        sys.path.insert(0, str(modules))
        try:
            with SolutionProcess("probe_host", solution, cgroup=group) as host:
                host.proc.wait(timeout=30)
                text = host.log_path.read_text()
        finally:
            sys.path.remove(str(modules))
        leaf = group.dirs[0].name
        assert leaf in text, text
    finally:
        group.close()
