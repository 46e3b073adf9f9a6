"""Invariant 5, one row per scoring whatever the agent does: rows the agent floods, a disk it fills (a
small tmpfs of the test's own, which needs root), a harness killed mid-row, a score socket it floods.

Scorings go through `score_run` with the scorer replaced by one made for the attack (or optimize_kernel's
real scorer called in this process): seconds each, no sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redteam_support import KERNEL_PARAMS, score_in_process, small_tier

from attempt_support import FLOOD as DISK_FLOOD
from attempt_support import Attempt
from openrebench.api import ScoreResult
from openrebench.harness import _score_service
from openrebench.harness._score_service import ScoringService, format_log
from openrebench.isolation import bwrap_binary, volume_problem
from openrebench.runs import Run, ScoreRow, _score_log, _scoring, get_environment, score_run
from openrebench.runs._score_log import MAX_MESSAGE_CHARS, MAX_ROW_BYTES, read_log

attack = pytest.mark.attack
CUT = "cut by the score log"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of 24 MiB of the test's own, which the attacks fill."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)],
                                           capture_output=True).returncode:
        pytest.skip("a small file system of the test's own needs root (mount -t tmpfs)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path, name: str = "flood") -> None:
    """The agent's flood: write to `folder/name` until the disk is full, to the last byte."""
    fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for block in (bytes(1 << 20), bytes(1 << 12), b"x"):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        os.close(fd)
    assert os.statvfs(folder).f_bavail == 0


def make_run(path: Path) -> Run:
    """An optimize_kernel run with its starting solution (no set-up scoring: a row is what is tested)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    run = Run.create(get_environment("optimize_kernel"), "mini", path)
    (run.workspace / "solution.py").write_text("def prefix_sum(x):\n    return x\n")
    return run


def scorer(result: Callable[[Path], ScoreResult]) -> Callable[..., ScoreResult]:
    """A stand-in for `score_solution`: `result` of the snapshot."""
    return lambda env_id, tier, solution, protected, **kw: result(solution)


def one_bounded_row_each(run: Run, scorings: int) -> list[_score_log.ScoreRow]:
    """Exactly one well-formed row per scoring, none lost, each line within the bound."""
    rows, warnings = read_log(run.score_log_path)
    assert warnings == [] and [r.index for r in rows] == list(range(scorings)), (len(rows), warnings)
    lines = run.score_log_path.read_bytes().splitlines()
    assert len(lines) == scorings and max(len(line) for line in lines) <= MAX_ROW_BYTES
    return rows


def _scored(run: Run) -> ScoreRow:
    """`score_run`, a row it could not write being the attack's success (an assertion), not an error."""
    try:
        return score_run(run, sandboxed=False)
    except OSError as e:
        raise AssertionError(f"attack works: the row was lost ({e})") from e


@attack(env="harness", cls="output flood", invariant=5)
def test_a_solution_printing_100_mb_gets_one_short_row(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Print 100 MB of escape codes from solution.py, then fail, so that the scorer quotes its output.

    optimize_kernel's real scorer (in this process): the quoted tail is read from the end of the output
    only, and the row holds a short message."""
    small_tier(monkeypatch, "optimize_kernel", "mini", **KERNEL_PARAMS)
    run = make_run(tmp_path / "run")
    (run.workspace / "solution.py").write_text(textwrap.dedent("""
        import sys
        chunk = ("\\x1b[2K" + "x" * 1019 + "\\n") * 1024
        for _ in range(100):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        raise RuntimeError("done printing")
    """))
    monkeypatch.setattr(_scoring, "score_solution", lambda env_id, tier, solution, protected, **kw:
                        score_in_process(env_id, solution, protected, tier))
    started = time.monotonic()
    row = _scored(run)
    assert row.raw is None and "done printing" in row.message, row.message
    assert len(row.message) <= MAX_MESSAGE_CHARS + 100
    one_bounded_row_each(run, 1)
    assert time.monotonic() - started < 60


@attack(env="harness", cls="row flood", invariant=5, defence="bounded-rows")
def test_a_scorer_quoting_all_the_output_on_a_full_disk(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Print 8 MB of control characters (6 bytes each in JSON), quoted whole by a plug-in's naive scorer
    in its message and details, with the disk filled first: the row must still fit the reserve."""
    run = make_run(disk / "run")
    output = ("\x01" * 127 + "\n") * (1 << 16)
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: ScoreResult.invalid(
        f"Invalid: the solution failed; its output:\n{output}", stdout=output, stderr=output)))
    fill(run.workspace)
    row = _scored(run)
    [logged] = one_bounded_row_each(run, 1)
    assert logged == row and CUT in row.message and row.message.startswith("Invalid: the solution failed")
    assert CUT in row.details["stdout"] and row.details["normalisation"]


@attack(env="harness", cls="row flood", invariant=5, defence="bounded-rows")
def test_details_with_a_huge_nested_structure(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer's details filled from the solution's output: 5,000 test cases, each with its output and a
    structure nested 40 deep, read from the scorer's JSON result line; the disk filled first."""
    run = make_run(disk / "run")
    deep: Any = "bottom"
    for _ in range(40):
        deep = {"inner": [deep, "\x1b" * 5]}
    line = json.dumps({"raw": None, "message": "Invalid: 5000 tests failed.", "details": {
        "tests": [{"case": i, "stdout": "\x00" * 300, "tree": deep} for i in range(5000)], "failures": 5000}})
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: ScoreResult.model_validate_json(line)))
    fill(run.workspace)
    row = _scored(run)
    one_bounded_row_each(run, 1)
    assert row.message == "Invalid: 5000 tests failed."
    # The short entries and the harness's own come through whole; the flood is cut, and says so.
    assert row.details["failures"] == 5000 and row.details["normalisation"]
    assert CUT in json.dumps(row.details["tests"])


@attack(env="harness", cls="row flood", invariant=5)
def test_file_names_of_255_odd_bytes_in_deep_folders(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Links and FIFOs with 255-byte names of control characters, newlines and bytes that are not UTF-8,
    30 folders deep, so that every snapshot note naming one is long and unwritable as JSON; disk filled."""
    run = make_run(disk / "run")
    fd = os.open(run.workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(30):
            name = bytes([1 + level]) + b"\n\xff\x1b" * 84 + b"\"\\"
            os.mkdir(name, dir_fd=fd)
            fd, parent = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        for i in range(300):
            name = b"%03d" % i + b"\xfe\x07\n" * 84
            os.symlink(b"/etc/passwd", name, dir_fd=fd) if i % 2 else os.mkfifo(name, dir_fd=fd)
    finally:
        os.close(fd)
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: ScoreResult(raw=0.5, message="Valid.")))
    fill(run.workspace)
    row = _scored(run)
    one_bounded_row_each(run, 1)
    assert row.raw == 0.5 and row.message == "Valid."  # the result itself, not "could not record"
    notes = row.details["snapshot_notes"]
    assert len(notes) > 50 and all(len(n) < 1000 for n in notes)


@attack(env="harness", cls="disk flood", invariant=5, defence="own-reserve")
def test_a_run_filling_the_disk_costs_another_run_no_row(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run A's agent fills the file system that run B's log lives on, and goes on writing: whatever space
    is freed (B's reserve file, as B's row needs it) A takes first, here always."""
    run_a, run_b = make_run(disk / "a"), make_run(disk / "b")
    real_write = _score_log._write

    def write_after_the_flood(fd: int, data: bytes) -> int:
        fill(run_a.workspace)  # A's flood wins every race for freed space
        return real_write(fd, data)

    monkeypatch.setattr(_score_log, "_write", write_after_the_flood)
    monkeypatch.setattr(_scoring, "score_solution",
                        scorer(lambda _: ScoreResult.invalid("Invalid: x." * 300)))
    fill(run_a.workspace)
    for _ in range(3):
        _scored(run_b)
    _scored(run_a)
    one_bounded_row_each(run_b, 3)
    one_bounded_row_each(run_a, 1)


@attack(env="harness", cls="disk flood", invariant=5)
def test_a_snapshot_on_a_disk_another_run_filled_is_a_row_that_says_so(
        disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run A fills the file system where snapshots are made: run B's scoring cannot copy its workspace,
    and must still get its one row, an infrastructure failure naming the full disk (not its solution)."""
    run_a, run_b = make_run(disk / "a"), make_run(disk / "b")
    (run_b.workspace / "weights.bin").write_bytes(os.urandom(1 << 20))
    (disk / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(disk / "tmp"))
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: ScoreResult(raw=1.0, message="Valid.")))
    fill(run_a.workspace)
    row = _scored(run_b)
    one_bounded_row_each(run_b, 1)
    assert row.raw is None and row.details["infrastructure"] is True
    assert "the disk is full" in row.message and "not caused by your solution" in row.message
    assert os.listdir(disk / "tmp") == []  # the partial copy is gone


@attack(env="harness", cls="disk flood", invariant=5)
def test_a_row_that_fits_only_in_part_is_written_whole(disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a file system that keeps no blocks past a file's end, fill the disk but for half a row: the
    write comes back short, is cut off, and the whole line goes again after the reserve is freed."""
    monkeypatch.setattr(_score_log, "_keep_tail", lambda fd: False)
    run = make_run(disk / "run")
    long = ScoreResult.invalid("Invalid: " + "y" * 9000)
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: long))
    fill(run.workspace)
    with open(run.workspace / "flood", "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) - 4096)  # one page free: less than the row
    writes: list[int] = []
    real_write = _score_log._write
    monkeypatch.setattr(_score_log, "_write", lambda fd, data: writes.append(n := real_write(fd, data)) or n)
    _scored(run)
    one_bounded_row_each(run, 1)
    assert len(writes) == 2 and writes[0] < writes[1], writes  # short, then whole


@attack(env="harness", cls="torn write", invariant=5, defence="fresh-line")
def test_a_harness_killed_mid_row_then_another_scoring(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness is killed (SIGKILL, the OOM killer) halfway through writing a row; the run goes on
    (resumed) and scores again: the torn line is reported, and no complete row is lost with it."""
    run = make_run(tmp_path / "run")
    monkeypatch.setattr(_scoring, "score_solution", scorer(lambda _: ScoreResult.invalid("Invalid: x.")))
    _scored(run)
    killed = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from openrebench.runs import _score_log, read_log
        def half(fd, data):
            os.write(fd, data[:len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        _score_log._write = half
        row = read_log(Path({str(run.score_log_path)!r}))[0][0]
        _score_log.append_row(Path({str(run.score_log_path)!r}), row)
    """)
    assert subprocess.run([sys.executable, "-c", killed]).returncode == -9
    _scored(run)
    rows, warnings = read_log(run.score_log_path)
    assert [r.index for r in rows] == [0, 1] and len(warnings) == 1 and "torn" in warnings[0]
    assert run.score_log_path.read_bytes().endswith(b"}\n")


FLOOD = textwrap.dedent("""
    import socket, sys, time
    held, deadline = [], time.monotonic() + 2
    while len(held) < int(sys.argv[2]) and time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(sys.argv[1])
        except OSError:  # the listen queue is full: again shortly
            s.close()
            time.sleep(0.002)
            continue
        held.append(s)
    print(len(held), flush=True)
    time.sleep(120)
""")


async def ask(sock: Path, op: str) -> str:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(json.dumps({"op": op}).encode() + b"\n")
    try:
        return json.loads(await asyncio.wait_for(reader.read(), 20))["text"]
    finally:
        writer.close()


@attack(env="harness", cls="denial of service", invariant=5, defence="score-socket-cap")
def test_a_connection_flood_on_one_runs_score_socket_costs_another_run_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open 400 idle connections to run A's score socket (each would hold one of the harness's descriptors,
    shared by every run and the model gateway, for 30 s), while run B scores and reads its log.

    The harness's descriptors are limited to 120 more than it had for the test, so that the flood
    reaches the limit at once: each run is served MAX_CONNECTIONS connections at a time, the rest wait
    unaccepted in the kernel's queue."""
    run_b = make_run(tmp_path / "b")
    monkeypatch.setattr(_scoring, "score_solution",
                        scorer(lambda _: ScoreResult(raw=1.0, message="Valid: B.")))

    async def score_b() -> str:
        return (await asyncio.to_thread(score_run, run_b, sandboxed=False)).message

    async def idle() -> str:
        return "A"

    async def scenario() -> tuple[list[str], int]:
        a, b = ScoringService(score=idle, log=lambda: "A"), ScoringService(score=score_b,
                                                                           log=lambda: format_log(run_b))
        await a.start(tmp_path / "a.sock")
        await b.start(tmp_path / "b.sock")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        flooder = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOD, str(tmp_path / "a.sock"),
                                                       "400", stdout=asyncio.subprocess.PIPE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 120, hard))
        try:
            assert flooder.stdout is not None
            await asyncio.wait_for(flooder.stdout.readline(), 60)
            await asyncio.sleep(0.5)
            try:
                answers = [await asyncio.wait_for(ask(tmp_path / "b.sock", op), 10)
                           for op in ("score", "log")]
            except OSError as e:
                raise AssertionError(f"attack works: run B was denied ({e})") from e
            return answers, a.connections
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            flooder.kill()
            await flooder.wait()
            a.close()
            b.close()

    answers, held = asyncio.run(scenario())
    assert answers[0] == "Valid: B." and "Valid: B." in answers[1], answers
    assert held <= _score_service.MAX_CONNECTIONS
    one_bounded_row_each(run_b, 1)


def _on_the_machines_disk(folder: Path) -> int:
    """Bytes the files under `folder` take on its file system (as `du -x`: what is mounted below, such as
    an attempt's disk, is counted as its image, not again as its contents)."""
    device, total = folder.lstat().st_dev, 0
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(root, name))
                if st.st_dev != device:  # a mount point: another file system
                    if name in dirs:
                        dirs.remove(name)
                    continue
                total += st.st_blocks * 512
    return total


@attack(env="harness", cls="disk flood", invariant=5, defence="attempt-disk")
@pytest.mark.skipif(bwrap_binary() is None or volume_problem() is not None,
                    reason="needs bubblewrap and attempt disks (root, loop devices)")
def test_an_agent_flooding_its_disk_takes_no_more_than_its_own(tmp_path: Path,
                                                               attempts: list[Attempt]) -> None:
    """An agent writes without end in its workspace, /tmp and home, through its sandbox: it must stop at
    its attempt's disk, so that the machine's disk keeps room for the other runs' snapshots, commands and
    rows, and a neighbour's commands and scoring go on as before."""
    flooder = Attempt(tmp_path / "flooder", disk_gb=0.25)
    neighbour = Attempt(tmp_path / "neighbour", disk_gb=0.25)
    attempts += [flooder, neighbour]
    before = _on_the_machines_disk(tmp_path)
    (flooder.run.workspace / "flood.py").write_text(DISK_FLOOD)  # through the bind: the attempt's disk
    # Every place it writes is on the one disk: the workspace, then /tmp and its home once that is full.
    said = flooder.sh("python3 flood.py /workspace/big 1000; python3 flood.py /tmp/big 1000; "
                      "python3 flood.py ~/big 1000")
    lines = said.split("\n")
    assert lines[0].startswith("full") and 150 <= int(lines[0].split()[1]) <= 256, said
    assert all(line.startswith("full") and int(line.split()[1]) < 5 for line in lines[1:3]), said
    # The machine's disk lost at most the quota: counted under the attempts' folders (their disks' images,
    # homes and workspaces; any write that escaped its disk lands there too), not as the disk's free space,
    # which the tests running beside this one move as well.
    assert _on_the_machines_disk(tmp_path) - before < 300 << 20
    # The neighbour is untouched: its commands write, its scoring snapshots and scores, its row is kept.
    neighbour.sh("echo fine > /workspace/mine.txt")
    neighbour.loop.run_until_complete(neighbour.box.score())
    rows, _ = neighbour.run.rows()
    assert rows[-1].raw is not None, rows[-1].message
    # The flooder's own scoring snapshots its 200-odd MB: the limits are the tier's, not the disk's.
    flooder.sh("rm -f /tmp/big ~/big")
    flooder.loop.run_until_complete(flooder.box.score())
    assert flooder.run.rows()[0][-1].message
