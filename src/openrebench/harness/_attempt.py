"""The attempt's record in its run directory (`attempt.json`): its state and the working time charged.

It lets an interrupted attempt continue where it stopped (`openrebench eval ... --resume`): the harness
died, the machine rebooted, a person's session was cut off. A run whose record says it is still running
while the process that ran it is gone, or that it was interrupted, is taken up by the next attempt of the
same environment and tier in the same runs folder, with its workspace, score log and charged time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from openrebench.isolation import process_alive
from openrebench.runs import Run

RECORD = "attempt.json"
State = Literal["running", "interrupted", "ended"]


class AttemptRecord(BaseModel):
    state: State = "running"
    pid: int = 0
    host: str = ""
    agent: str | None = None
    epoch: int | None = None
    charged_s: float = 0.0  # working time charged so far (the clock the scorings log)
    resumed: int = 0  # times the attempt was continued
    updated: float = 0.0

    @classmethod
    def read(cls, run_path: Path) -> AttemptRecord | None:
        try:
            return cls.model_validate_json((run_path / RECORD).read_text())
        except (OSError, ValueError):
            return None

    def write(self, run_path: Path) -> None:
        self.updated = time.time()
        tmp = run_path / f".{RECORD}.{os.getpid()}"
        tmp.write_text(self.model_dump_json(indent=1) + "\n")
        tmp.replace(run_path / RECORD)


def _alive(pid: int, host: str) -> bool:
    if host and host != os.uname().nodename:
        return True  # another machine's: not ours to take
    return process_alive(pid)


def continuable(runs_dir: Path, env_id: str, tier: str, agent: str | None,
                epoch: int | None) -> Iterator[Path]:
    """Runs of this environment, tier and agent (and epoch, where known) in `runs_dir` that an attempt
    left unfinished, newest first."""
    if not runs_dir.is_dir():
        return
    candidates = []
    for path in runs_dir.iterdir():
        record = AttemptRecord.read(path)
        if record is None or record.state == "ended" or record.agent != agent:
            continue
        if epoch is not None and record.epoch is not None and record.epoch != epoch:
            continue
        if record.state == "running" and _alive(record.pid, record.host):
            continue
        try:
            info = Run.open(path).info
        except Exception:
            continue
        if info.env_id == env_id and info.tier == tier:
            candidates.append((record.updated, path))
    for _, path in sorted(candidates, reverse=True):
        yield path


@contextlib.contextmanager
def claimed(runs_dir: Path) -> Iterator[None]:
    """One claim at a time in a runs folder: two attempts resumed at once never take the same run."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(runs_dir / ".resume.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def current_epoch() -> int | None:
    """The epoch of the sample being set up, where Inspect says (None outside a sample)."""
    try:
        from inspect_ai.log._samples import sample_active

        active = sample_active()
        return int(active.epoch) if active is not None else None
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
