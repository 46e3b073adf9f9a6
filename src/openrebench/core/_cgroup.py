"""Memory, process-count and CPU limits for a whole sandbox, through cgroups (v1 or v2).

Per-process rlimits cannot stop a tree of processes that each stay under the limit, and RLIMIT_NPROC
counts every process of the sandbox uid, across sandboxes. A cgroup limits exactly one sandbox.
Processes join by running `enter_prefix()` (a shell that writes its own pid into the group, then
execs the real command), so nothing it forks can escape the group.
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


class Cgroup:
    """A fresh cgroup with a memory and a pids limit; `close()` kills what is left and removes it."""

    def __init__(self, dirs: list[Path], files: dict[Path, str]) -> None:
        self.dirs = dirs
        self.cpu_limited = any(p.name in ("cpu.cfs_quota_us", "cpu.max") for p in files)
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
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
        return None

    def enter_prefix(self) -> list[str]:
        """A command prefix that moves the command into this cgroup before it starts."""
        writes = "; ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "openrebench-cgroup"]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return found

    def memory_peak_bytes(self) -> int | None:
        for d in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                with contextlib.suppress(OSError, ValueError):
                    return int((d / name).read_text())
        return None

    def kill_all(self) -> None:
        for _ in range(50):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def close(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
