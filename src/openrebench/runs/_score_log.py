"""The append-only score log: one JSON object per line, each written, flushed and fsynced.

Only the harness writes it, and every scoring must end in exactly one row whatever the agent did:

- A row is bounded (`bound_row`): the fields the agent can fill (the message quoting its output, notes
  naming its files, details a scorer filled from its output) are cut, with a marker, so that any row
  is at most MAX_ROW_BYTES, well inside the reserve.
- A row is written whole: one write of the full line, cut off again if it fails part-way; a writer
  killed mid-row leaves a torn last line, which readers skip with a warning and the next append starts
  on a fresh line after, so no complete row is ever lost.
- A full disk must not cost a row: the log keeps TAIL_BYTES allocated past its end (fallocate with
  FALLOC_FL_KEEP_SIZE), blocks that only this log's writes can use, so another run flooding the same
  file system cannot take them; a reserve file beside the log, freed on ENOSPC and made again afterwards,
  backs it up where the file system cannot keep blocks past the end of a file.
"""

from __future__ import annotations

import contextlib
import ctypes
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


MAX_MESSAGE_CHARS = 4000  # the message the agent sees: its head and tail kept
MAX_TEXT_CHARS = 4000  # any one string of the details (tracebacks, output tails)
MAX_DETAILS_BYTES = 64 << 10  # the details as JSON
MAX_DEPTH = 12  # levels of nesting kept in the details
_OTHER_BYTES = 4096  # the row's other fields, keys and markers, with room to spare
# JSON writes a character of a bounded text in at most 6 bytes (`\u001f`; 4 for others not ASCII, 2 for a
# backslash), so no row is longer than this:
MAX_ROW_BYTES = 6 * MAX_MESSAGE_CHARS + MAX_DETAILS_BYTES + _OTHER_BYTES
RESERVE_FILE = ".score_log.reserve"
RESERVE_BYTES = 1 << 20  # the reserve file: 11 rows of the largest size
TAIL_BYTES = 4 << 20  # kept allocated past the log's end: 45 rows of the largest size, ~700 usual ones
assert RESERVE_BYTES >= 8 * MAX_ROW_BYTES
_write = os.write  # the one place rows reach the disk (tests fill the disk here)
_FALLOC_FL_KEEP_SIZE = 1


def _utf8(text: str) -> str:
    """`text` writable as UTF-8: lone surrogates (undecodable file names) escaped, not an error that
    would cost the row."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bound_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` in at most `limit` characters plus a marker: its head and its tail (where reasons and
    tracebacks end), writable as UTF-8."""
    if len(text) <= limit and len(clean := _utf8(text)) <= limit:
        return clean
    half = max(limit, 0) // 2
    head, tail = _utf8(text[:half])[:half], _utf8(text[len(text) - half:])[-half:] if half else ""
    return f"{head}…[cut by the score log: {len(text):,} characters in all]…{tail}"


def _cost(text: str) -> int:
    """An upper bound on the bytes pydantic writes for a text (json.dumps escapes more)."""
    return len(json.dumps(text))


_MARK = "…[cut by the score log: {}]"


def _leaf(value: Any, limit: int) -> str:
    """A value that is not plain JSON data as a bounded text (never an exception: that would cost the row)."""
    try:
        if isinstance(value, int):
            return f"an integer of {value.bit_length()} bits"
        return bound_text(value if isinstance(value, str) else repr(value[:limit] if isinstance(
            value, bytes | bytearray) else value), limit)
    except Exception:
        return f"<{type(value).__name__}>"


def _bound(value: Any, budget: list[int], depth: int) -> Any:
    """`value` as plain JSON data spending at most about `budget[0]` bytes: texts cut, containers cut where
    the budget runs out or nesting passes MAX_DEPTH, each cut marked."""
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and abs(value) < 1 << 63):
        budget[0] -= 24
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if not isinstance(value, dict | list | tuple | set | frozenset):
        text = _leaf(value, min(MAX_TEXT_CHARS, max(budget[0] // 6, 8)))
        budget[0] -= _cost(text)
        return text
    if depth >= MAX_DEPTH:
        budget[0] -= 48
        return _MARK.format("nested too deep")
    entries = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    kept: list[tuple[Any, Any]] = []
    budget[0] -= 2
    for key, item in entries:
        if budget[0] <= 0:
            break
        if isinstance(value, dict):
            key = bound_text(str(key), min(200, max(budget[0] // 6, 8)))
            budget[0] -= _cost(key)
        budget[0] -= 2
        kept.append((key, _bound(item, budget, depth + 1)))
    if len(kept) < len(entries):
        kept.append(("…", _MARK.format(f"{len(entries) - len(kept):,} more entries")))
        budget[0] -= 80
    return dict(kept) if isinstance(value, dict) else [v for _, v in kept]


def bound_details(details: dict[str, Any]) -> dict[str, Any]:
    """The details within about MAX_DETAILS_BYTES, in their own order: each entry bounded to half of that,
    then kept smallest first, so that a flood in one entry cannot crowd out the others (the
    infrastructure flag, the normalisation constants)."""
    sized = []
    for key, value in details.items():
        budget = [MAX_DETAILS_BYTES // 2]
        bounded = _bound(value, budget, 1)
        sized.append((bound_text(str(key), 200), bounded, MAX_DETAILS_BYTES // 2 - budget[0]))
    room, kept = MAX_DETAILS_BYTES, set()
    for key, _, cost in sorted(sized, key=lambda e: e[2]):
        room -= cost + _cost(key) + 2
        if room < 0:
            break
        kept.add(key)
    out = {key: value for key, value, _ in sized if key in kept}
    if len(kept) < len(sized):
        out["…"] = _MARK.format(f"{len(sized) - len(kept):,} more entries")
    return out


def bound_row(row: ScoreRow) -> ScoreRow:
    """`row` with what the agent can fill cut to the limits above: at most MAX_ROW_BYTES as a line,
    always writable (checked here: a row that still does not fit keeps only its scalar details)."""
    row = row.model_copy(update={"message": bound_text(row.message, MAX_MESSAGE_CHARS),
                                 "solution_sha256": bound_text(row.solution_sha256, 128),
                                 "details": bound_details(row.details)})
    try:
        if len(row.model_dump_json().encode()) <= MAX_ROW_BYTES:
            return row
    except ValueError:
        pass
    kept = {k: v for k, v in row.details.items() if v is None or isinstance(v, bool | int | float)}
    return row.model_copy(update={"details": {**kept, "…": "cut by the score log: the details did not fit"}})


def reserve_path(log: Path) -> Path:
    return log.with_name(RESERVE_FILE)


def _libc_fallocate() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        return fallocate
    return None


_fallocate = _libc_fallocate()


def _keep_tail(fd: int) -> bool:
    """Keep TAIL_BYTES allocated past the end of the log, without changing its size: rows written there
    need no free space, so a disk another run filled cannot cost this run its rows (a freed reserve
    file's blocks are anyone's, and a run flooding the disk takes them back first). False where the file
    system cannot, or the disk is already full."""
    end = os.fstat(fd).st_size + TAIL_BYTES
    return _fallocate is not None and _fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, end) == 0


def make_reserve(log: Path) -> bool:
    """Set aside TAIL_BYTES of disk past the end of `log` and RESERVE_BYTES in a reserve file beside it
    (owner-only); False where the reserve file could not be made (the disk already full)."""
    with contextlib.suppress(OSError):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            _keep_tail(fd)
        finally:
            os.close(fd)
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


def _fresh_line(fd: int) -> bytes:
    """A newline to start with where a killed writer left its row unfinished, so that the next row is not
    glued to it (and lost with it)."""
    size = os.fstat(fd).st_size
    return b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""


def _write_line(fd: int, line: bytes, log: Path) -> bool:
    """Append `line` in one write, whole or not at all: a short or failed write is cut off again, so a full
    disk leaves no torn row; on ENOSPC the reserve file is freed once and the whole line written again.
    True if the reserve was used."""
    start, freed = os.fstat(fd).st_size, False
    while True:
        try:
            error = None if _write(fd, line) == len(line) else OSError(errno.ENOSPC, "a short write")
        except OSError as e:
            error = e
        if error is None:
            return freed
        if os.fstat(fd).st_size != start:
            os.ftruncate(fd, start)
        if error.errno not in (errno.ENOSPC, errno.EDQUOT) or freed or not reserve_path(log).exists():
            raise error
        reserve_path(log).unlink()
        freed = True


def append_row(path: Path, row: ScoreRow) -> ScoreRow:
    """Append `row` (its index set to the next free one, bounded by `bound_row`) durably, under an
    exclusive lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    freed = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rows, _ = read_log(path)
        row = bound_row(row.model_copy(update={"index": len(rows)}))
        freed = _write_line(fd, _fresh_line(fd) + row.model_dump_json().encode() + b"\n", path)
        os.fsync(fd)
        _keep_tail(fd)  # what this row took of the tail, allocated again where there is room
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
