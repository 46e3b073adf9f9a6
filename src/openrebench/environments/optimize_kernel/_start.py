"""The solution host, started before the scorer imports torch.

Importing torch takes seconds (3.5 s on an H100 node), and the host must import it too: started first,
the host imports it while the scorer does, instead of after. Nothing here imports torch. The host starts
in its cgroup (before any code of its own runs) with the input buffer's memfd on the CPU; the scorer
(scorer.py) takes it from there: buffers, baseline, import, checks and timed calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.api import (
    ScoreResult,
    SolutionError,
    SolutionProcess,
    TierSpec,
    become_solution,
    solution_cgroup,
)

from .params import KernelParams

HOST_MODULE = "openrebench.environments.optimize_kernel._host"


@dataclass(frozen=True)
class Started:
    """A started host, its cgroup and (CPU) the memfd it inherited; or the result that ends the scoring."""

    host: SolutionProcess | None = None
    group: Any = None
    input_fd: int | None = None
    result: ScoreResult | None = None


def input_memfd(n: int) -> int:
    """An int32 buffer of n elements in a sealed memfd: it cannot be shrunk, so the scorer's own mapping
    can never fault, whatever the host does with it."""
    fd = os.memfd_create("optimize-kernel-input", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    os.ftruncate(fd, max(4 * n, 4))
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def _not_dumpable() -> None:
    """Keep a solution running as this process's uid from reading its memory (the expected outputs)
    through /proc or ptrace; where the solution has as many privileges as the scorer, only the scoring
    sandbox (another uid) protects it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


@contextlib.contextmanager
def host_started(spec: TierSpec[KernelParams], solution: Path) -> Iterator[Started]:
    """Start the host (see the module's docstring); everything it started is killed on leaving.

    On a GPU the scorer first becomes the solution's uid (CUDA IPC does not cross uids; this environment
    reads no protected data), with no way back and non-dumpable, so the solution can neither trace it nor
    read its memory, though they share a uid. Every process of the solution lives in one cgroup: frozen
    outside its windows on the CPU (no pause made of signals, which a solution could undo), killed whole
    at the end; a CPU scoring without a freezer is refused."""
    cuda = spec.device == "cuda"
    if cuda:
        become_solution()
    _not_dumpable()
    group = solution_cgroup()
    fd: int | None = None
    host: SolutionProcess | None = None
    try:
        if not cuda and (group is None or not group.can_freeze):
            yield Started(result=ScoreResult.invalid(
                "Invalid: infrastructure failure (this machine gives the scorer no cgroup freezer, so the "
                "solution's processes cannot be paused between timed calls), not caused by your solution.",
                infrastructure=True))
            return
        if not cuda:
            fd = input_memfd(spec.params.length)
        try:
            host = SolutionProcess(HOST_MODULE, solution, cgroup=group, pass_fds=() if fd is None else (fd,))
        except SolutionError as e:
            yield Started(result=ScoreResult.invalid(f"Invalid: {e}"))
            return
        yield Started(host, group, fd)
    finally:
        if host is not None:
            host.close()
        if group is not None:
            group.close()
        if fd is not None:
            os.close(fd)
