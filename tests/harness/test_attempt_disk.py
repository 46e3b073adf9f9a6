"""An attempt's disk of its own: one run filling its disk cannot take the machine's, so no other run loses
its scorings' snapshots, its commands or its rows; the agent's files come back into the run's workspace
when the attempt ends, or stay in an image beside it when they cannot."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import IMAGE_NAME, bwrap_binary, volume_problem
from openrebench.isolation import _volume as volume_module
from openrebench.runs import Run, start_run

pytestmark = [pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available"),
              pytest.mark.skipif(volume_problem() is not None,
                                 reason=f"no attempt disks here: {volume_problem()}")]

MIB = 1 << 20
FLOOD = """
import errno, os, sys
written = 0
try:
    with open(sys.argv[1], "wb") as f:
        while written < int(sys.argv[2]) << 20:
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
        os.fsync(f.fileno())
except OSError as e:
    print("full" if e.errno == errno.ENOSPC else f"error {e.errno}", written >> 20)
else:
    print("wrote", written >> 20)
"""


class Attempt:
    def __init__(self, path: Path, disk_gb: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.run: Run = start_run("example_fit", "mini", path, score_start=False)[0]
        config = SandboxConfig(env_id="example_fit", memory_limit_gb=1, disk_gb=disk_gb)
        self.box = self.loop.run_until_complete(OpenRebenchSandbox.for_run(self.run, config))

    def sh(self, script: str) -> str:
        result = self.loop.run_until_complete(self.box.exec(["bash", "-c", script], timeout=120))
        assert result.success, result.stderr
        return result.stdout

    def close(self) -> None:
        self.loop.run_until_complete(self.box.close())
        self.loop.close()


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[list[Attempt]]:
    made: list[Attempt] = []
    yield made
    for attempt in made:
        attempt.close()


def test_a_flood_stops_at_the_attempts_disk_and_a_neighbour_scores(tmp_path: Path,
                                                                    attempts: list[Attempt]) -> None:
    flooder = Attempt(tmp_path / "flooder", disk_gb=0.25)
    neighbour = Attempt(tmp_path / "neighbour", disk_gb=0.25)
    attempts += [flooder, neighbour]
    free = shutil.disk_usage(tmp_path).free
    (flooder.run.workspace / "flood.py").write_text(FLOOD)  # through the bind: the attempt's disk
    # Every place it writes is on the one disk: the workspace, then /tmp and its home once that is full.
    said = flooder.sh("python3 flood.py /workspace/big 1000; python3 flood.py /tmp/big 1000; "
                      "python3 flood.py ~/big 1000")
    lines = said.split("\n")
    assert lines[0].startswith("full") and 150 <= int(lines[0].split()[1]) <= 256, said
    assert all(line.startswith("full") and int(line.split()[1]) < 5 for line in lines[1:3]), said
    assert free - shutil.disk_usage(tmp_path).free < 300 * MIB  # the machine's disk lost at most the quota
    # The neighbour is untouched: its commands write, its scoring snapshots and scores, its row is kept.
    neighbour.sh("echo fine > /workspace/mine.txt")
    neighbour.loop.run_until_complete(neighbour.box.score())
    rows, _ = neighbour.run.rows()
    assert rows[-1].raw is not None, rows[-1].message
    # The flooder's own scoring snapshots its 200-odd MB: the limits are the tier's, not the disk's.
    flooder.sh("rm -f /tmp/big ~/big")
    flooder.loop.run_until_complete(flooder.box.score())
    assert flooder.run.rows()[0][-1].message


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
