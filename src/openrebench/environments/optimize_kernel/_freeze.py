"""Pausing every process of the solution, so that nothing it started runs outside a timed window.

Inside the scorer's own PID namespace (the scorer is PID 1, or its parent is: bubblewrap's init)
every process other than the scorer and its ancestors is the solution's: children, daemons that
double-forked or left the session, zombie leaders with live threads. Without a namespace only the
host's session can be found (a process that calls setsid escapes; the harness always scores in a
namespace where one can be made). A freeze sends SIGSTOP until a scan finds every thread of every
such process stopped, so a process forked during the scan is caught by the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from openrebench.api import SolutionError

_STOPPED = frozenset("tTZXx")


def _stat_fields(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.rsplit(b")", 1)[1].decode().split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Freezer:
    def __init__(self, host_pid: int) -> None:
        self.host_pid = host_pid
        self.namespace = os.getpid() == 1 or (os.getppid() == 1 and _comm(1) == "bwrap")
        keep, pid = {os.getpid()}, os.getpid()
        while pid > 1 and (fields := _stat_fields(f"/proc/{pid}/stat")):
            pid = int(fields[1])
            keep.add(pid)
        self._keep = keep
        self._paused: list[int] = []

    def processes(self) -> list[int]:
        """Every process of the solution that exists now."""
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in self._keep]
        if self.namespace:
            return pids
        return [p for p in pids if (f := _stat_fields(f"/proc/{p}/stat")) and int(f[3]) == self.host_pid]

    @staticmethod
    def _stopped(pid: int) -> bool:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return True  # gone
        for tid in tids:
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
            if fields is not None and fields[0] not in _STOPPED:
                return False
        return True

    def freeze(self, timeout: float = 5.0) -> None:
        """Return once every thread of every solution process is stopped; SolutionError otherwise.
        Done when a scan, made after all processes found so far had stopped, finds no new one: a
        stopped process cannot fork, and a child forked before its parent stopped is already listed."""
        deadline = time.monotonic() + timeout
        known: set[int] = set()
        while new := [p for p in self.processes() if p not in known]:
            known.update(new)
            pending = new
            while pending := [p for p in pending if not self._stopped(p)]:
                if time.monotonic() > deadline:
                    raise SolutionError(f"{len(pending)} process(es) of the solution could not be paused "
                                        f"within {timeout:g} s")
                for pid in pending:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                os.sched_yield()  # the threads must run to stop
        self._paused = sorted(known)

    def resume(self) -> None:
        """Continue what the last freeze stopped (nothing new can have started since)."""
        for pid in self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._paused = []

    def kill_all(self) -> None:
        """End everything the solution started (stopped processes die from SIGKILL too)."""
        for _ in range(3):
            pids = self.processes()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                return
