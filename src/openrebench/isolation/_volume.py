"""An attempt's disk of its own: a file system of fixed size holding everything the agent can write.

One run filling the machine's disk would cost the others their scorings' snapshots, their agents'
commands and the harness's own logs. Where the harness is root and loop devices work, each attempt's
writable places (the workspace, its home, /tmp, /opt and /var/tmp) live on an ext4 file system in a
sparse image file of the attempt's disk size, loop-mounted: a write past it fails with ENOSPC inside the
attempt (the kernel's limit, not a check the agent could race), and the machine's disk keeps the rest.

The workspace is copied onto the volume when the attempt starts and back into the run's folder when it
ends (after the agent's processes are gone), so the run's layout does not change. Where that copy fails
(the machine's disk is full when the attempt ends), the image stays in the run folder
(`workspace.img`) with a note beside it: the agent's files are never lost. A harness killed outright
leaves the same work to its janitor, which reads the volume's record (`release_recorded`).

Elsewhere (not root, no loop device, no mkfs.ext4) `volume_problem` says why, and attempts run without a
disk of their own (the README's threat model says what that leaves open).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORKSPACE_DIR = ".workspace"  # the workspace's place on the volume, beside the agent's other places
IMAGE_NAME = "workspace.img"  # where the image lives in the run folder
NOTE_NAME = "workspace.img.README"
RECORD_NAME = "volume.json"


@functools.cache
def volume_problem() -> str | None:
    """Why attempts cannot have a disk of their own here, or None where they can: asked of the machine
    once per process by making, mounting and unmounting a small one (a container may show
    /dev/loop-control and still refuse the mount)."""
    if os.geteuid() != 0:
        return "the harness is not root (a loop mount needs it)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup", "cp"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    with tempfile.TemporaryDirectory(prefix="orb-disk-probe-") as tmp:
        image, mnt = Path(tmp) / "probe.img", Path(tmp) / "mnt"
        mnt.mkdir()
        try:
            with open(image, "wb") as f:
                f.truncate(16 << 20)
            _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image))
            _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mnt))
        except OSError as e:
            return f"a loop mount failed here ({e})"
        _unmount(mnt)
    return None


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    if result.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed: {(result.stderr or result.stdout).strip()[-300:]}")


def _copy_tree(src: Path, dst: Path) -> None:
    """Everything under src into dst (which exists), links as links, owners and modes kept."""
    _run("cp", "-a", "--no-dereference", "--", f"{src}/.", str(dst))


@dataclass
class Volume:
    """The attempt's file system: `image` (sparse, in the run folder) mounted at `mountpoint` (the
    attempt's state folder), its `.workspace` bound over the run's `workspace`."""

    image: Path
    mountpoint: Path
    workspace: Path
    size_bytes: int

    @property
    def on_volume(self) -> Path:
        return self.mountpoint / WORKSPACE_DIR

    @classmethod
    def create(cls, image: Path, mountpoint: Path, workspace: Path, size_bytes: int) -> Volume:
        """Make the file system, move what `mountpoint` holds onto it, mount it there, copy the workspace
        onto it and bind that copy over the workspace. Undone whole where a step fails."""
        volume = cls(image, mountpoint, workspace, size_bytes)
        staged = mountpoint.with_name(mountpoint.name + ".staged")
        if image.exists():
            _wait_detached(image)  # a janitor may still be releasing it (its harness just died)
        if image.exists():  # an earlier attempt's, never released (the machine went down with it)
            recover(image, workspace, mountpoint.with_name(mountpoint.name + ".recovering"))
        try:
            with open(image, "wb") as f:
                f.truncate(size_bytes)
            os.chmod(image, 0o600)
            _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                 "-E", "lazy_itable_init=1,nodiscard", str(image))
            os.rename(mountpoint, staged)
            mountpoint.mkdir(mode=0o755)
            _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint))
            shutil.rmtree(mountpoint / "lost+found", ignore_errors=True)
            _copy_tree(staged, mountpoint)
            volume.on_volume.mkdir()
            os.chmod(volume.on_volume, os.stat(workspace).st_mode & 0o7777)
            _copy_tree(workspace, volume.on_volume)
            _run("mount", "--bind", str(volume.on_volume), str(workspace))
        except BaseException:
            with contextlib.suppress(OSError):
                _unmount(workspace, only_if_mounted_from=volume.on_volume)
            with contextlib.suppress(OSError):
                _unmount(mountpoint)
            if staged.exists():
                shutil.rmtree(mountpoint, ignore_errors=True)
                os.rename(staged, mountpoint)
            image.unlink(missing_ok=True)
            raise
        shutil.rmtree(staged, ignore_errors=True)
        return volume

    def record(self, path: Path) -> None:
        """What the janitor needs to release the volume if the harness dies first."""
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        path.write_text(json.dumps(fields))

    def release(self) -> str | None:
        """Copy the workspace back into the run folder and take the volume down (the agent's processes
        must be gone). Returns None, or where the agent's files are when the copy could not be made."""
        _unmount(self.workspace, only_if_mounted_from=self.on_volume)
        if not os.path.ismount(self.mountpoint):
            return None  # released already
        try:
            for entry in self.workspace.iterdir():  # what a failed earlier release left half-copied
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            _copy_tree(self.on_volume, self.workspace)
        except OSError as e:
            _unmount(self.mountpoint)
            note = self.image.with_name(NOTE_NAME)
            with contextlib.suppress(OSError):
                note.write_text(f"The workspace could not be copied back when the attempt ended ({e}).\n"
                                f"Its files are in {self.image.name}: mount -o loop,ro {self.image.name} "
                                f"/mnt and read them under /mnt/{WORKSPACE_DIR}.\n")
            return str(self.image)
        _unmount(self.mountpoint)
        self.image.unlink(missing_ok=True)
        return None


def _unmount(path: Path, only_if_mounted_from: Path | None = None) -> None:
    """Unmount `path` if something is mounted there (lazily where it is still busy)."""
    if not os.path.ismount(path):
        return
    if only_if_mounted_from is not None and os.stat(path).st_dev != os.stat(only_if_mounted_from).st_dev:
        return  # not our bind (another mount over the same folder)
    try:
        _run("umount", str(path))
    except OSError:
        _run("umount", "-l", str(path))


def _wait_detached(image: Path, timeout_s: float = 120.0) -> None:
    """Wait while a loop device still holds the image: the janitor of a harness that died is copying its
    workspace back. Starting on the run meanwhile would race that copy; past the timeout, refuse."""
    deadline = time.monotonic() + timeout_s
    while image.exists():
        found = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=30)
        if found.returncode != 0 or not found.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise OSError(f"{image} is still in use by an earlier attempt of this run "
                          f"({found.stdout.strip()})")
        time.sleep(0.5)


def recover(image: Path, workspace: Path, scratch: Path) -> None:
    """Put the workspace an image holds back into the run folder: what an attempt wrote before the
    machine went down with it (no release, no janitor) is the run's latest state, not the folder's
    stale copy beneath the old mount. An image that cannot be read is set aside, never deleted."""
    scratch.mkdir(mode=0o700, exist_ok=True)
    try:
        _run("mount", "-o", "loop,ro,nosuid,nodev,noexec", str(image), str(scratch))
    except OSError:
        image.rename(image.with_name(f"{image.name}.unreadable"))
        scratch.rmdir()
        return
    try:
        for entry in workspace.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        _copy_tree(scratch / WORKSPACE_DIR, workspace)
    finally:
        _unmount(scratch)
        scratch.rmdir()
    image.unlink()
    image.with_name(NOTE_NAME).unlink(missing_ok=True)


def release_recorded(record: Path) -> str | None:
    """`Volume.release` from a record the harness wrote (the janitor's way, after the harness died)."""
    data = json.loads(record.read_text())
    volume = Volume(Path(data["image"]), Path(data["mountpoint"]), Path(data["workspace"]),
                    int(data["size_bytes"]))
    return volume.release()
