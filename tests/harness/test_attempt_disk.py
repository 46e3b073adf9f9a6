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
