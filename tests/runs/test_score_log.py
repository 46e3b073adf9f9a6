import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from openrebench.runs import ScoreRow, append_row, read_log


def make_row(raw: float | None, message: str = "ok") -> ScoreRow:
    return ScoreRow(index=-1, timestamp=datetime.now(UTC), elapsed_s=1.5, kind="score", charged=True,
                    raw=raw, normalised=None, message=message, details={"x": [1, 2]})


def test_rows_round_trip_with_sequential_indices(tmp_path: Path) -> None:
    log = tmp_path / "score_log.jsonl"
    for raw in (1.0, None, 3.0):
        append_row(log, make_row(raw))
    rows, warnings = read_log(log)
    assert warnings == []
    assert [r.index for r in rows] == [0, 1, 2]
    assert [r.raw for r in rows] == [1.0, None, 3.0]
    assert rows[0].details == {"x": [1, 2]}
    assert all(line.startswith("{") for line in log.read_text().splitlines())


def test_writer_killed_mid_row_leaves_a_readable_log(tmp_path: Path) -> None:
    log = tmp_path / "score_log.jsonl"
    append_row(log, make_row(1.0, "before"))
    # A real writer process that dies by SIGKILL halfway through writing its row.
    half = make_row(2.0, "torn").model_dump_json()[:40]
    script = (f"import os, signal; fd = os.open({str(log)!r}, os.O_WRONLY | os.O_APPEND); "
              f"os.write(fd, {half.encode()!r}); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -9
    rows, warnings = read_log(log)
    assert [r.message for r in rows] == ["before"]
    assert len(warnings) == 1 and "unreadable row" in warnings[0]
    # The next append starts on a fresh line, so neither row is lost.
    append_row(log, make_row(3.0, "after"))
    rows, warnings = read_log(log)
    assert [r.message for r in rows] == ["before", "after"]
    assert rows[-1].index == 1
    assert len(warnings) == 1


def test_missing_log_reads_as_empty(tmp_path: Path) -> None:
    assert read_log(tmp_path / "none.jsonl") == ([], [])
