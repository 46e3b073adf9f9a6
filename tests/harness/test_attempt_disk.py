"""An attempt's disk of its own: one run filling its disk cannot take the machine's, so no other run loses
its scorings' snapshots, its commands or its rows; the agent's files come back into the run's workspace
when the attempt ends, or stay in an image beside it when they cannot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attempt_support import Attempt
from openrebench.isolation import IMAGE_NAME, bwrap_binary, volume_problem
from openrebench.isolation import _volume as volume_module

pytestmark = [pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available"),
              pytest.mark.skipif(volume_problem() is not None,
                                 reason=f"no attempt disks here: {volume_problem()}")]


def test_the_agents_files_come_back_into_the_run(tmp_path: Path, attempts: list[Attempt]) -> None:
    attempt = Attempt(tmp_path / "run", disk_gb=0.25)
    attempts.append(attempt)
    image = attempt.run.path / IMAGE_NAME
    assert image.is_file() and os.path.ismount(attempt.run.workspace)
    attempt.sh("mkdir -p out/deep && echo result > out/deep/r.txt && ln -s out/deep/r.txt link "
               "&& rm data/train.csv && chmod 700 out")
    attempts.remove(attempt)
    attempt.close()
    ws = attempt.run.workspace
    assert not os.path.ismount(ws) and not image.exists()
    assert (ws / "out" / "deep" / "r.txt").read_text() == "result\n"
    assert os.readlink(ws / "link") == "out/deep/r.txt"  # a link stays a link, followed by nothing
    assert not (ws / "data" / "train.csv").exists()  # a deletion holds too
    assert (ws / "out").stat().st_mode & 0o777 == 0o700


def test_a_workspace_that_cannot_be_copied_back_stays_in_its_image(tmp_path: Path, attempts: list[Attempt],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    attempt = Attempt(tmp_path / "run", disk_gb=0.25)
    attempts.append(attempt)
    attempt.sh("echo precious > precious.txt")
    real = volume_module._copy_tree

    def full(src: Path, dst: Path) -> None:
        if src.name == volume_module.WORKSPACE_DIR:  # the copy back: the machine's disk is full
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(volume_module, "_copy_tree", full)
    attempts.remove(attempt)
    attempt.close()
    image, ws = attempt.run.path / IMAGE_NAME, attempt.run.workspace
    assert attempt.box.backend.volume_kept == str(image)  # type: ignore[attr-defined]
    assert image.is_file() and not os.path.ismount(ws)
    note = (attempt.run.path / volume_module.NOTE_NAME).read_text()
    assert "No space left" in note and "mount -o loop,ro workspace.img" in note
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    volume_module._run("mount", "-o", "loop,ro", str(image), str(mnt))
    try:
        assert (mnt / volume_module.WORKSPACE_DIR / "precious.txt").read_text() == "precious\n"
    finally:
        volume_module._run("umount", str(mnt))


def test_an_image_left_by_a_machine_that_went_down_is_taken_up(tmp_path: Path) -> None:
    """Neither the harness nor its janitor released the disk (the machine went down): the next attempt on
    the run finds its image and starts from what the agent had written, not from the stale folder."""
    workspace, state = tmp_path / "workspace", tmp_path / "state"
    workspace.mkdir()
    state.mkdir()
    (workspace / "old.txt").write_text("from before the attempt\n")
    image = tmp_path / IMAGE_NAME
    first = volume_module.Volume.create(image, state, workspace, 64 << 20)
    (workspace / "new.txt").write_text("written during the attempt\n")
    (workspace / "old.txt").unlink()
    volume_module._run("umount", str(workspace))  # the machine goes down: the mounts go, the image stays
    volume_module._run("umount", str(state))
    assert (workspace / "old.txt").exists() and not (workspace / "new.txt").exists()
    second = volume_module.Volume.create(image, state, workspace, 64 << 20)
    try:
        assert (workspace / "new.txt").read_text() == "written during the attempt\n"
        assert not (workspace / "old.txt").exists()
    finally:
        assert second.release() is None
    assert first.image == second.image and not image.exists()
    assert sorted(p.name for p in workspace.iterdir()) == ["new.txt"]
