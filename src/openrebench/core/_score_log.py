"""The append-only score log: one JSON object per line, each written, flushed and fsynced.

Only the harness writes it. A writer killed mid-row leaves a torn last line; readers skip it with a
warning and the next append starts on a fresh line, so no complete row is ever lost.
"""

from __future__ import annotations

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
    message: str = Field(description="What the agent sees.")
    details: dict[str, Any] = Field(default_factory=dict, description="Hidden from the agent.")
    solution_sha256: str = ""
    duration_s: float = 0.0

    @property
    def valid(self) -> bool:
        return self.raw is not None


def append_row(path: Path, row: ScoreRow) -> ScoreRow:
    """Append `row` (its index set to the next free one) durably, under an exclusive lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
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
        os.write(fd, prefix + row.model_dump_json().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
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
