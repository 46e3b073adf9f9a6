"""The snapshot of the workspace: links, special files, files that change while it is copied, and its limits
(which count every entry, and every file at its full size, before anything is copied)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from openrebench.api import OpenRebenchError, ScoreResult
from openrebench.runs import Run, _scoring, _snapshot, score_run, snapshot_workspace

ENV = "core"
SECRET = b"protected-secret-4411"


def _race(workspace: Path, flip: Callable[[int], None], tries: int = 150) -> list[str]:
    """Snapshot `tries` times while a thread keeps calling `flip`; what went wrong, if anything."""
    stop = threading.Event()

    def flipper() -> None:
        i = 0
        while not stop.is_set():
            flip(i)
            i += 1

    problems: list[str] = []
    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    try:
        for k in range(tries):
            dest = workspace.parent / f"snap{k}"
            try:
                snapshot_workspace(workspace, dest)
            except OpenRebenchError:
                continue  # a clear refusal is fine
            except Exception as e:  # a crash means no row
                problems.append(f"crash: {type(e).__name__}: {e}")
                break
            for f in dest.rglob("*"):
                if f.is_file() and SECRET in f.read_bytes():
                    problems.append(f"copied protected data through {f.relative_to(dest)}")
    finally:
        stop.set()
        t.join()
    return problems


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    ws, protected = tmp_path / "workspace", tmp_path / "protected"
    (ws / "d").mkdir(parents=True)
    protected.mkdir()
    for i in range(20):
        (ws / "d" / f"f{i}.txt").write_text("mine")
        (protected / f"f{i}.txt").write_bytes(SECRET)
    return ws, protected


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU", invariant=7)
def test_directory_swapped_for_a_link_during_the_copy(tmp_path: Path) -> None:
    """A directory is renamed away and replaced by a link to protected/ while the snapshot walks it."""
    ws, protected = _workspace(tmp_path)

    def flip(i: int) -> None:
        try:
            if i % 2 == 0:
                os.rename(ws / "d", ws / "real")
                os.symlink(protected, ws / "d")
            else:
                os.unlink(ws / "d")
                os.rename(ws / "real", ws / "d")
        except OSError:
            pass

    problems = _race(ws, flip)
    assert problems == [], f"attack works: {problems[:2]}"


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU", invariant=7)
def test_file_swapped_for_a_link_or_fifo_during_the_copy(tmp_path: Path) -> None:
    """A file turns into a link to protected data, then into a FIFO, while the snapshot copies it."""
    ws, protected = _workspace(tmp_path)
    target = ws / "d" / "f0.txt"

    def flip(i: int) -> None:
        try:
            target.unlink()
            if i % 3 == 0:
                target.symlink_to(protected / "f0.txt")
            elif i % 3 == 1:
                os.mkfifo(target)
            else:
                target.write_text("mine")
        except OSError:
            pass

    problems = _race(ws, flip)
    assert problems == [], f"attack works: {problems[:2]}"


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU", invariant=7)
def test_file_vanishing_during_the_copy(tmp_path: Path) -> None:
    """Files are deleted and re-created while the snapshot runs: a clear refusal or a copy, never a crash."""
    ws, _ = _workspace(tmp_path)

    def flip(i: int) -> None:
        f = ws / "d" / f"f{i % 20}.txt"
        with contextlib.suppress(OSError):
            f.unlink() if f.exists() else f.write_text("mine")

    problems = _race(ws, flip)
    assert problems == [], f"attack works: {problems[:2]}"


@pytest.mark.attack(env=ENV, cls="links in the workspace", invariant=7)
def test_links_and_special_files_are_not_followed(tmp_path: Path) -> None:
    """Links to protected files and folders and a FIFO in the workspace. (A hard link is copied as its
    content: the agent cannot make one to protected data, which is never mounted in its sandbox.)"""
    ws, protected = _workspace(tmp_path)
    (ws / "link.txt").symlink_to(protected / "f1.txt")
    (ws / "linkdir").symlink_to(protected)
    os.mkfifo(ws / "pipe")
    (ws / "mine.txt").write_text("mine")
    os.link(ws / "mine.txt", ws / "hard.txt")
    dest = tmp_path / "snap"
    snapshot_workspace(ws, dest)
    leaked = [str(f.relative_to(dest)) for f in dest.rglob("*") if f.is_file() and SECRET in f.read_bytes()]
    assert not any((dest / name).exists() for name in ("link.txt", "linkdir", "pipe"))
    assert leaked == [], f"attack works: protected data copied ({leaked})"
    assert (dest / "hard.txt").read_text() == "mine"


MiB = 1 << 20


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the bytes the snapshot reads from the agent's files (what it then writes is at most that)."""
    real, seen = _snapshot._read, {"bytes": 0}

    def read(fd: int, n: int) -> bytes:
        block = real(fd, n)
        seen["bytes"] += len(block)
        return block

    monkeypatch.setattr(_snapshot, "_read", read)
    return seen


def _refused(ws: Path, dest: Path, match: str, max_bytes: int = _snapshot.MAX_SNAPSHOT_BYTES) -> None:
    """The snapshot is refused with `match` in its message, and leaves no partial copy behind."""
    try:
        snapshot_workspace(ws, dest, max_bytes=max_bytes)
    except OpenRebenchError as e:
        assert re.search(match, str(e)) and "\n" not in str(e), str(e)
    else:
        raise AssertionError("attack works: the snapshot was taken, no limit crossed")
    assert not dest.exists(), f"a partial snapshot was left behind: {sorted(os.listdir(dest))[:5]}"


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7, defence="snapshot-counting")
def test_sparse_files_count_at_their_apparent_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 GB sparse file (no disk used) makes the harness read and write zeros up to the byte limit."""
    ws = tmp_path / "workspace"
    ws.mkdir()
    with open(ws / "huge.bin", "wb") as f:
        f.truncate(100 * 1024**3)
    seen = _counting_reads(monkeypatch)
    _refused(ws, tmp_path / "snap", "snapshot limit", max_bytes=8 * MiB)
    assert seen["bytes"] == 0, f"attack works: {seen['bytes']:,} bytes of zeros read before the refusal"
    (ws / "huge.bin").unlink()  # several sparse files, each under the limit, together over it
    for i in range(3):
        with open(ws / f"part{i}.bin", "wb") as f:
            f.truncate(3 * MiB)
    _refused(ws, tmp_path / "snap", "snapshot limit", max_bytes=8 * MiB)
    assert seen["bytes"] <= 8 * MiB, f"attack works: {seen['bytes']:,} bytes read for an 8 MiB limit"


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7, defence="snapshot-counting")
def test_links_fifos_and_sockets_count_against_the_entry_limit(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Millions of symlinks, FIFOs and sockets are skipped, so the entry limit never stops the walk."""
    monkeypatch.setattr(_snapshot, "MAX_SNAPSHOT_FILES", 50)
    ws = tmp_path / "workspace"
    ws.mkdir()
    for i in range(60):
        (ws / f"l{i}").symlink_to("nowhere")
    for i in range(20):
        os.mkfifo(ws / f"p{i}")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(ws / "sock"))
        _refused(ws, tmp_path / "snap", "more than 50 files and folders")


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7, defence="snapshot-counting")
def test_hard_links_count_once_per_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One file hard-linked many times: each link is copied whole, so each must count, bytes and entries."""
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "weights.bin").write_bytes(os.urandom(3 * MiB))
    for i in range(2):
        os.link(ws / "weights.bin", ws / f"link{i}.bin")
    seen = _counting_reads(monkeypatch)
    _refused(ws, tmp_path / "snap", "snapshot limit", max_bytes=8 * MiB)
    assert seen["bytes"] <= 8 * MiB, f"attack works: {seen['bytes']:,} bytes read for an 8 MiB limit"
    monkeypatch.setattr(_snapshot, "MAX_SNAPSHOT_FILES", 50)
    (ws / "small.txt").write_text("mine")
    for i in range(60):
        os.link(ws / "small.txt", ws / f"small{i}.txt")
    _refused(ws, tmp_path / "snap", "more than 50 files and folders")


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7, defence="snapshot-counting")
def test_a_folder_of_very_many_names_is_not_listed_whole(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of a million names: listing it whole holds every name in memory before any limit applies."""
    monkeypatch.setattr(_snapshot, "MAX_SNAPSHOT_FILES", 50)
    ws = tmp_path / "workspace"
    (ws / "many").mkdir(parents=True)
    for i in range(20_000):  # a million on a real attack; the memory held grows with it
        os.close(os.open(ws / "many" / f"{i:0>40}", os.O_CREAT | os.O_WRONLY, 0o644))
    tracemalloc.start()
    try:
        with pytest.raises(OpenRebenchError, match="more than 50 files and folders"):
            snapshot_workspace(ws, tmp_path / "snap")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"attack works: {peak:,} bytes held to refuse a folder over a 50-entry limit"


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7)
def test_a_file_growing_while_copied_is_cut_at_its_size(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that never stops growing while it is copied (a writer appending faster than the copy reads)."""
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "train.log").write_bytes(b"x" * MiB)
    seen = {"bytes": 0}

    def endless(fd: int, n: int) -> bytes:
        seen["bytes"] += n
        return b"x" * n

    monkeypatch.setattr(_snapshot, "_read", endless)
    _refused(ws, tmp_path / "snap", "train.log changed while the snapshot was taken", max_bytes=64 * MiB)
    assert seen["bytes"] <= 2 * MiB, f"attack works: {seen['bytes']:,} bytes read from a 1 MiB file"


@pytest.mark.attack(env=ENV, cls="snapshot limits", invariant=7)
@pytest.mark.parametrize("limit", ["depth", "entries", "bytes"])
def test_a_workspace_over_a_limit_is_the_solutions_invalid_row(kernel_run: Run, limit: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace too deep, too many entries or too many bytes: the harness must not blame itself."""
    ws = kernel_run.workspace
    if limit == "depth":
        deep = ws.joinpath(*["d"] * (_snapshot.MAX_SNAPSHOT_DEPTH + 5))
        deep.mkdir(parents=True)
        (deep / "x.txt").write_text("deep")
        expected = f"the workspace is nested deeper than {_snapshot.MAX_SNAPSHOT_DEPTH} folders"
    elif limit == "entries":
        monkeypatch.setattr(_snapshot, "MAX_SNAPSHOT_FILES", 50)
        for i in range(60):
            (ws / f"l{i}").symlink_to("nowhere")
        expected = "the workspace holds more than 50 files and folders"
    else:
        with open(ws / "huge.bin", "wb") as f:
            f.truncate(100 * 1024**3)  # sparse: over the tier's limit without a byte on disk
        seen = _counting_reads(monkeypatch)  # the guard below keeps a broken defence from reading 4 GiB
        counted = _snapshot._read
        monkeypatch.setattr(_snapshot, "_read", lambda fd, n: counted(fd, n) if seen["bytes"] < 64 * MiB
                            else pytest.fail("attack works: the harness reads the sparse file's zeros"))
        expected = "the workspace is over the 4 GiB snapshot limit"
    monkeypatch.setattr(_scoring, "score_solution",
                        lambda *a, **k: pytest.fail("scored an over-limit workspace"))
    before = set(Path(tempfile.gettempdir()).glob("openrebench-snapshot-*"))
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw is None and row.message.startswith(f"Invalid: {expected}"), row.message
    assert "\n" not in row.message and "infrastructure" not in row.message and "Traceback" not in row.message
    assert not row.details.get("infrastructure")
    assert set(Path(tempfile.gettempdir()).glob("openrebench-snapshot-*")) == before


@pytest.mark.attack(env=ENV, cls="snapshot notes", invariant=7)
def test_odd_names_give_bounded_one_line_notes(kernel_run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipped links named with newlines, bytes that are not UTF-8 and 255-byte names, by the thousand."""
    ws = os.fsencode(kernel_run.workspace)
    for i in range(1_000):
        name = b"%d\nInvalid: forged line \xff\xfe " % i
        os.symlink(b"nowhere", ws + b"/" + name + b"z" * (255 - len(name)))
    monkeypatch.setattr(_scoring, "score_solution", lambda *a, **k: ScoreResult(raw=1.0, message="Valid."))
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw == 1.0 and not row.details.get("infrastructure"), f"attack works: {row.message}"
    notes = row.details["snapshot_notes"]
    assert 0 < len(notes) <= 201 and all(len(n) <= 300 and n.isprintable() for n in notes), notes[:3]
    assert kernel_run.rows()[0][-1].details["snapshot_notes"] == notes
