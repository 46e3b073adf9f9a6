"""The snapshot of the workspace: links, special files and files that change while it is copied."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from openrebench.api import OpenRebenchError
from openrebench.runs._scoring import snapshot_workspace

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


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU")
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


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU")
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


@pytest.mark.attack(env=ENV, cls="snapshot TOCTOU")
def test_file_vanishing_during_the_copy(tmp_path: Path) -> None:
    """Files are deleted and re-created while the snapshot runs: a clear refusal or a copy, never a crash."""
    ws, _ = _workspace(tmp_path)

    def flip(i: int) -> None:
        f = ws / "d" / f"f{i % 20}.txt"
        with contextlib.suppress(OSError):
            f.unlink() if f.exists() else f.write_text("mine")

    problems = _race(ws, flip)
    assert problems == [], f"attack works: {problems[:2]}"


@pytest.mark.attack(env=ENV, cls="links in the workspace")
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
