"""The append-only score log: one JSON object per line, each written, flushed and fsynced.

Only the harness writes it. A writer killed mid-row leaves a torn last line; readers skip it with a
warning and the next append starts on a fresh line, so no complete row is ever lost. A full disk must
not cost a row either: the run keeps a small reserve file beside the log, freed when a write fails
with ENOSPC (the row then fits) and made again afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError


class ScoreRow(BaseModel):
    """One scoring of one snapshot of the solution."""

    index: int
    timestamp: datetime
    elapsed_s: float = Field(description="Working seconds since the run started (not charged for set-up).")
    kind: Literal["setup", "score", "calibration"]
    charged: bool = Field(description="Whether this scoring counts against the agent's time.")
    raw: float | None = Field(description="Raw score; None when the solution was invalid.")
    normalised: float | None
    normalised_paper: float | None = Field(default=None, description=(
        "Paper-matched normalised score: the improvement over the start measured here in units of the "
        "paper's start-to-reference gap (None: invalid, or no paper constants; rows written before it "
        "was recorded)."))
    message: str = Field(description="What the agent sees.")
    details: dict[str, Any] = Field(default_factory=dict, description="Hidden from the agent.")
    solution_sha256: str = ""
    duration_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.raw is not None


RESERVE_FILE = ".score_log.reserve"
RESERVE_BYTES = 1 << 20
_write = os.write  # the one place rows reach the disk (tests fill the disk here)


def reserve_path(log: Path) -> Path:
    return log.with_name(RESERVE_FILE)


def make_reserve(log: Path) -> bool:
    """Set aside RESERVE_BYTES of disk beside `log` (owner-only); False where the disk is already full."""
    path = reserve_path(log)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(fd, 0)
            for _ in range(RESERVE_BYTES >> 16):
                _write(fd, bytes(1 << 16))
        return True
    except OSError:
        os.close(fd)
        fd = -1
        with contextlib.suppress(OSError):
            path.unlink()  # a partial reserve is useless
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _write_all(fd: int, data: bytes, log: Path) -> bool:
    """Write `data`; on ENOSPC free the reserve once and carry on. True if the reserve was used."""
    view, freed = memoryview(data), False
    while view:
        try:
            view = view[_write(fd, view):]
        except OSError as e:
            if e.errno != errno.ENOSPC or freed or not reserve_path(log).exists():
                raise
            reserve_path(log).unlink()
            freed = True
    return freed


def append_row(path: Path, row: ScoreRow) -> ScoreRow:
    """Append `row` (its index set to the next free one) durably, under an exclusive lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    freed = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        prefix = b""
        if size:
            os.lseek(fd, size - 1, os.SEEK_SET)
            if os.read(fd, 1) != b"\n":
                prefix = b"\n"  # a torn row from a killed writer: start on a fresh line
        rows, _ = read_log(path)
        row = row.model_copy(update={"index": len(rows)})
        freed = _write_all(fd, prefix + row.model_dump_json().encode() + b"\n", path)
        os.fsync(fd)
    finally:
        os.close(fd)
    if freed:
        make_reserve(path)  # for the next full disk, if there is room again
    return row


def read_log(path: Path) -> tuple[list[ScoreRow], list[str]]:
    """All complete rows, and a warning for each line that could not be read."""
    rows: list[ScoreRow] = []
    warnings: list[str] = []
    if not path.exists():
        return rows, warnings
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(ScoreRow.model_validate(json.loads(line)))
            except (ValueError, ValidationError):
                warnings.append(f"{path.name}:{number}: unreadable row skipped (torn or corrupted)")
    return rows, warnings
