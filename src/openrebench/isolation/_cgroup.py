"""Memory, process-count and CPU limits, freezing and process accounting, through cgroups (v1 or v2).

Per-process rlimits cannot stop a tree of processes that each stay under the limit, and RLIMIT_NPROC
counts every process of the sandbox uid, across sandboxes. A cgroup limits exactly one sandbox.
Processes join by running `enter_prefix()` (a shell that writes its own pid into the group, then
execs the real command) or by `add(pid)` from outside, so nothing it forks can escape the group: an
unprivileged process cannot move itself out, whatever it does to its process tree (double forks, new
sessions, re-parenting, a leader that exits while its threads work on). The kernel's own list of the
group's threads (v1 `tasks`, v2 `cgroup.threads`) is therefore the truth about what still runs, and a
frozen group cannot fork while it is being killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path ('' for the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths


def _ids(path: Path) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        return {int(p) for p in path.read_text().split()}
    return set()


class Cgroup:
    """A cgroup (one directory per v1 hierarchy, or one v2 directory). `close()` kills what is left in it
    and removes the directories this object made."""

    def __init__(self, dirs: list[Path], files: dict[Path, str] | None = None, *, owned: bool = True) -> None:
        self.dirs = dirs
        self.owned = owned
        files = files or {}
        self.cpu_limited = any(p.name in ("cpu.cfs_quota_us", "cpu.max") for p in files)
        self.version = "v2" if any((d / "cgroup.events").exists() for d in dirs) else "v1"
        for path, value in files.items():
            path.write_text(value)

    @classmethod
    def create(cls, name: str, *, memory_bytes: int | None, max_pids: int | None,
               cpus: float | None = None) -> Cgroup | None:
        """A new cgroup, or None where this process may not make one (then rlimits are all we have)."""
        own = _own_paths()
        leaf = f"openrebench-{name}-{uuid.uuid4().hex[:8]}"
        made: list[Path] = []
        try:
            if "memory" in own and (CGROUP_ROOT / "memory").is_dir():  # v1
                mem = CGROUP_ROOT / "memory" / own["memory"].lstrip("/") / leaf
                pids = CGROUP_ROOT / "pids" / own.get("pids", "/").lstrip("/") / leaf
                files: dict[Path, str] = {}
                for d in (mem, pids):
                    d.mkdir()
                    made.append(d)
                freezer = CGROUP_ROOT / "freezer" / own.get("freezer", "/").lstrip("/") / leaf
                if (CGROUP_ROOT / "freezer").is_dir():
                    with contextlib.suppress(OSError):  # freezing is optional: killing falls back to a loop
                        freezer.mkdir()
                        made.append(freezer)
                cpu_dir = CGROUP_ROOT / "cpu" / own.get("cpu", own.get("cpu,cpuacct", "/")).lstrip("/") / leaf
                if cpus and (CGROUP_ROOT / "cpu").is_dir():
                    cpu_dir.mkdir()
                    made.append(cpu_dir)
                    files[cpu_dir / "cpu.cfs_period_us"] = "100000"
                    files[cpu_dir / "cpu.cfs_quota_us"] = str(int(cpus * 100000))
                if memory_bytes:
                    files[mem / "memory.limit_in_bytes"] = str(memory_bytes)
                    with contextlib.suppress(OSError):  # swap accounting is optional
                        (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                if max_pids:
                    files[pids / "pids.max"] = str(max_pids)
                return cls(made, files)
            if "" in own and (CGROUP_ROOT / "cgroup.controllers").exists():  # v2
                group = CGROUP_ROOT / own[""].lstrip("/") / leaf
                group.mkdir()
                made.append(group)
                files = {}
                if memory_bytes:
                    files[group / "memory.max"] = str(memory_bytes)
                    files[group / "memory.swap.max"] = "0"
                if max_pids:
                    files[group / "pids.max"] = str(max_pids)
                if cpus:
                    files[group / "cpu.max"] = f"{int(cpus * 100000)} 100000"
                return cls(made, files)
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
        return None

    @classmethod
    def attach(cls, dirs: list[Path]) -> Cgroup | None:
        """An existing cgroup made by someone else (e.g. bound into a sandbox by the harness), or None
        where its directories are missing or not cgroups. `close()` kills its tasks but keeps it."""
        if not dirs or not all((d / "cgroup.procs").is_file() for d in dirs):
            return None
        return cls(list(dirs), owned=False)

    def child(self, name: str) -> Cgroup:
        """A sub-group in every hierarchy of this one. It has no limits of its own: the parent's hold for
        it too (v1 hierarchies with use_hierarchy, v2 always). Raises OSError where none can be made."""
        made: list[Path] = []
        try:
            for d in self.dirs:
                (d / name).mkdir()
                made.append(d / name)
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return Cgroup(made)

    def limit_memory(self, memory_bytes: int) -> None:
        """Cap this group's memory (and swap) below its parent's: the kernel then kills within this group
        first. Raises OSError where the limit cannot be written."""
        for d in self.dirs:
            if (d / "memory.max").exists():  # v2
                (d / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
            elif (d / "memory.limit_in_bytes").exists():  # v1's memory hierarchy
                (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # swap accounting is optional
                    (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))

    def enter_prefix(self) -> list[str]:
        """A command prefix that moves the command into this cgroup before it starts (or fails it)."""
        writes = " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "openrebench-cgroup"]

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into this cgroup; raises OSError where that fails."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def _all_dirs(self) -> list[Path]:
        """This group's directories and every sub-group below them."""
        found: list[Path] = []
        for d in self.dirs:
            for root, _, _ in os.walk(d):
                found.append(Path(root))
        return found

    def pids(self) -> set[int]:
        """Processes (thread-group ids) in the group and its sub-groups, as seen from this PID namespace."""
        found: set[int] = set()
        for d in self._all_dirs():
            found |= _ids(d / "cgroup.procs")
        return found

    def tasks(self) -> set[int]:
        """Every thread in the group and its sub-groups: a process whose leader exited while its other
        threads run on is still here (v1 `tasks`, v2 `cgroup.threads`)."""
        found: set[int] = set()
        for d in self._all_dirs():
            found |= _ids(d / ("cgroup.threads" if self.version == "v2" else "tasks"))
        return found

    def _freezer_dir(self) -> Path | None:
        for d in self.dirs:
            if (d / ("cgroup.freeze" if self.version == "v2" else "freezer.state")).is_file():
                return d
        return None

    @property
    def can_freeze(self) -> bool:
        return self._freezer_dir() is not None

    def _set_frozen(self, frozen: bool, timeout_s: float) -> bool:
        d = self._freezer_dir()
        if d is None:
            return False
        if self.version == "v2":
            (d / "cgroup.freeze").write_text("1" if frozen else "0")
            want = "frozen 1" if frozen else "frozen 0"
            done = lambda: want in (d / "cgroup.events").read_text().splitlines()  # noqa: E731
        else:
            state = "FROZEN" if frozen else "THAWED"
            (d / "freezer.state").write_text(state)
            done = lambda: (d / "freezer.state").read_text().strip() == state  # noqa: E731
        deadline = time.monotonic() + timeout_s
        pause = 5e-5  # tasks stop within microseconds when idle: poll fast first (timed scorings wait here)
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return True

    def freeze(self, timeout_s: float = 10.0) -> bool:
        """Stop every task of the group where it stands (no CPU, no forks) until `thaw()`. False where
        the group has no freezer or not every task stopped within `timeout_s` (e.g. stuck in I/O)."""
        return self._set_frozen(True, timeout_s)

    def thaw(self, timeout_s: float = 10.0) -> bool:
        return self._set_frozen(False, timeout_s)

    def wait_empty(self, timeout_s: float, poll_s: float = 0.01) -> bool:
        """Wait until no thread is left in the group; False if some still are after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.tasks():
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return True

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """SIGKILL everything in the group: frozen first (nothing forks while the list is read), killed,
        thawed (the kills land), sub-groups frozen by someone else included (a scorer killed while its
        solution's group was frozen). True once the group is empty."""
        for _ in range(20):
            left = self.tasks() | self.pids()
            if not left:
                return True
            frozen = False
            with contextlib.suppress(OSError):
                frozen = self.freeze(timeout_s=1.0)
            for pid in self.tasks() | self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if frozen:
                with contextlib.suppress(OSError):
                    self.thaw(timeout_s=1.0)
            self._thaw_below()
            if self.wait_empty(timeout_s / 20):
                return True
        return not self.tasks()

    def _thaw_below(self) -> None:
        """Thaw every sub-group that froze itself (v1 keeps a child's own FROZEN state through the
        parent's thaw; v2 children inherit, but may have frozen themselves too)."""
        for d in self._all_dirs():
            if d in self.dirs:
                continue
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                with contextlib.suppress(OSError):
                    if (d / name).is_file():
                        (d / name).write_text(value)

    def memory_peak_bytes(self) -> int | None:
        for d in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                with contextlib.suppress(OSError, ValueError):
                    return int((d / name).read_text())
        return None

    def close(self) -> None:
        self.kill_all()
        if self.can_freeze:
            with contextlib.suppress(OSError):
                self.thaw(timeout_s=1.0)  # a frozen group would hold its killed tasks alive
        if not self.owned:
            return
        for d in sorted(self._all_dirs(), key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
