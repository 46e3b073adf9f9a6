"""Identities for sandboxes: a uid per trust domain, never used twice on a machine.

The agent's sandbox of an attempt, and each scoring's solution, run as a uid of their own when the
harness is root. What the kernel keys by uid (process-count limits, inotify and message-queue quotas,
file ownership anywhere a sandbox can write, and whatever else a future kernel adds) then never joins
two trust domains: not the agent with its own scorings (which see held-out data), not two runs. A uid
is taken from a machine-wide counter under a lock and never handed out again, so no state a finished
domain left behind belongs to a later one.

Run as an ordinary user, the harness cannot switch uids: every sandbox runs as that user, in user
namespaces of its own (`identities_available` says which case holds).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

FIRST_UID = 1_600_000_000  # far above system and subordinate-uid ranges (100000-165535 by default)
LAST_UID = 2_000_000_000
STATE_DIR_ENV = "OPENREBENCH_IDENTITY_DIR"
DEFAULT_STATE_DIR = Path("/var/lib/openrebench")


def identities_available() -> bool:
    """Whether sandboxes get uids of their own (the harness is root)."""
    return os.geteuid() == 0


def _state_dir() -> Path:
    """Machine-wide, not per user cache: two harnesses with different homes must not hand out one uid."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def allocate_uid(purpose: str = "sandbox") -> int:
    """A uid (also used as the gid) that no sandbox on this machine has had before. Root only."""
    if not identities_available():
        raise PermissionError("only root can give a sandbox a uid of its own")
    folder = _state_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    counter = folder / "next-uid"
    fd = os.open(counter, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        uid = FIRST_UID
        with contextlib.suppress(ValueError):
            uid = max(FIRST_UID, int(text))
        if uid > LAST_UID:
            raise RuntimeError(f"{counter}: every sandbox uid from {FIRST_UID} to {LAST_UID} has been used")
        data = f"{uid + 1}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError), open(folder / "log", "a") as log:
        log.write(f"{uid} {purpose} pid={os.getpid()}\n")
    return uid


def passwd_lines(uid: int, name: str, home: str) -> tuple[str, str]:
    """A passwd and a group line naming `uid` (tools look the user up: getpass, torch's caches)."""
    return f"{name}:x:{uid}:{uid}:openrebench {name}:{home}:/bin/bash", f"{name}:x:{uid}:"


def identity_files(folder: Path, uid: int, name: str, home: str) -> tuple[Path, Path]:
    """passwd and group files for a sandbox: the host's, without any entry for `uid`, plus `name`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file, line in zip(("passwd", "group"), passwd_lines(uid, name, home), strict=True):
        try:
            host = Path("/etc", file).read_text().splitlines()
        except OSError:
            host = []
        kept = [x for x in host if x.split(":")[2:3] != [str(uid)] and x.split(":")[0] != name]
        path = folder / file
        path.write_text("\n".join([*kept, line]) + "\n")
        path.chmod(0o644)
        paths.append(path)
    return paths[0], paths[1]
