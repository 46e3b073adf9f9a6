"""One machine, measured quietly: a machine's calibration (the start's and the reference's times, which
every later score on it is normalised with) must not share the CPU with anything an attempt runs.

Every attempt's sandbox registers its agent's cgroup here while it lives (`registered`). A scoring holds
the machine's measurement lock shared (`measurement_slot`, `acquire_slot`); a calibration holds it
exclusively (`quiet_machine`): it waits until no scoring runs anywhere on the machine, keeps new ones
waiting, and freezes every registered attempt's agent until it is done. The registry and the lock
are per user (one user's calibration cannot freeze another's attempts), in a folder of the system's
temporary directory (`OPENREBENCH_MACHINE_DIR` names another: the test suite gives each test its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path

from ._cgroup import Cgroup

MACHINE_DIR_ENV = "OPENREBENCH_MACHINE_DIR"
_HELD: ContextVar[bool] = ContextVar("openrebench_measurement_slot", default=False)


def machine_dir() -> Path:
    folder = Path(os.environ.get(MACHINE_DIR_ENV) or
                  Path(tempfile.gettempdir()) / f"openrebench-machine-{os.geteuid()}")
    (folder / "attempts").mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def _lock_fd() -> int:
    return os.open(machine_dir() / "measure.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def registered(dirs: Sequence[Path]) -> Iterator[None]:
    """This process's attempt, whose agent's cgroup is `dirs`, known to calibrations while it lives."""
    entry = machine_dir() / "attempts" / f"{os.getpid()}-{secrets.token_hex(4)}.json"
    part = entry.with_suffix(".part")
    part.write_text(json.dumps({"pid": os.getpid(), "cgroup": [str(d) for d in dirs]}))
    part.replace(entry)
    try:
        yield
    finally:
        entry.unlink(missing_ok=True)


def live_attempts() -> list[list[Path]]:
    """The agent cgroups of the attempts registered by processes still alive (a dead harness's entry is
    removed)."""
    found = []
    for entry in sorted((machine_dir() / "attempts").glob("*.json")):
        try:
            record = json.loads(entry.read_text())
            os.kill(int(record["pid"]), 0)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
            continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append([Path(d) for d in record.get("cgroup", [])])
    return found


def acquire_slot() -> int | None:
    """Wait for the measurement lock, shared (while a calibration holds it, this waits); the descriptor to
    hand to `held_slot`, or None where this context holds the lock already."""
    if _HELD.get():
        return None
    fd = _lock_fd()
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


@contextlib.contextmanager
def held_slot(fd: int | None) -> Iterator[None]:
    """The lock `acquire_slot` took, held by this context until the block ends (scorings started in it,
    threads included, do not ask again)."""
    token = _HELD.set(True)
    try:
        yield
    finally:
        _HELD.reset(token)
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def measurement_slot() -> Iterator[None]:
    """A scoring's share of the machine: no calibration runs meanwhile."""
    with held_slot(acquire_slot()):
        yield


@contextlib.contextmanager
def quiet_machine() -> Iterator[int]:
    """The machine to itself: once every scoring on it has ended, none starts and every registered
    attempt's agent is frozen until the block ends (then thawed). Yields how many attempts were frozen."""
    fd = _lock_fd()
    fcntl.flock(fd, fcntl.LOCK_EX)
    token = _HELD.set(True)
    frozen: list[Cgroup] = []
    try:
        for dirs in live_attempts():
            group = Cgroup.attach(dirs)
            if group is not None and group.can_freeze and group.freeze():
                frozen.append(group)
        yield len(frozen)
    finally:
        for group in frozen:
            group.thaw()
        _HELD.reset(token)
        os.close(fd)
