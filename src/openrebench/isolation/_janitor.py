"""The janitor: a process that outlives the harness just long enough to clean up after it.

A harness killed outright (SIGKILL, an OOM kill, a crash of Python) runs no `finally`: its sandboxes die
with it (bubblewrap's --die-with-parent, then their PID namespaces), but their cgroups, temporary folders
and the scorings' snapshots would stay behind. Each harness process starts one janitor (lazily, in a
session of its own, so that Ctrl-C at the terminal does not reach it), holds the write end of a pipe to
it, and tells it what to clean (`track`) and what is already clean (`untrack`). When the pipe closes, by
the harness's exit of any kind, the janitor kills whatever is left in the tracked cgroups, removes them
and the tracked folders, and exits.

The protocol is one line per message, `track|untrack cgroup|volume|dir PATH`, each written whole
(shorter than PIPE_BUF), so messages from the harness's threads never interleave. A volume (an
attempt's disk of its own, `_volume`) is released after the cgroups' processes are killed and before
the folders go: its workspace is copied back into the run folder (or its image kept there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_janitor: tuple[int, int, Any] | None = None  # (our pid, the janitor's pid, our end of its pipe)


def _send(line: str) -> None:
    global _janitor
    data = (line.replace("\n", " ") + "\n").encode()
    if len(data) > 4000:  # longer than PIPE_BUF: could interleave; no path of ours is this long
        logger.warning("janitor: path too long to track: %s", line[:200])
        return
    with _lock:
        if _janitor is None or _janitor[0] != os.getpid() or not process_alive(_janitor[1]):
            _janitor = (os.getpid(), *_start())
        try:
            _janitor[2].write(data)
            _janitor[2].flush()
        except OSError:
            logger.warning("janitor: gone; %s will not be cleaned if the harness dies", line)


def _start() -> tuple[int, Any]:
    """Start the janitor detached: through a shell that backgrounds it and exits, so that it is no child
    of the harness (a scorer's process-tree accounting, run in the harness's process by tests, would
    count it as left running) and, in a session of its own, out of reach of the terminal's Ctrl-C."""
    read, write = os.pipe()
    # The pipe becomes the janitor's stdin in Python, not by the shell's `<&N`: dash takes one digit there,
    # and the harness's descriptors often pass 9.
    boot = (f"import os, runpy; os.dup2({read}, 0); os.close({read}); "
            "runpy.run_module('openrebench.isolation._janitor', run_name='__main__', alter_sys=True)")
    shell = subprocess.Popen(
        ["/bin/sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', sys.executable, boot],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, pass_fds=(read,), start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    out, _ = shell.communicate()
    os.close(read)
    return int(out.strip()), os.fdopen(write, "wb")


def process_alive(pid: int) -> bool:
    """Whether process `pid` lives (a zombie does not: not being our child, we could not reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (not reaped by us: it is not our child) is gone
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def track(kind: str, path: Path | str) -> None:
    """Have the janitor clean `path` (a cgroup directory or a folder) if the harness dies first."""
    _send(f"track {kind} {path}")


def untrack(kind: str, path: Path | str) -> None:
    """`path` is cleaned (or handed on): forget it."""
    _send(f"untrack {kind} {path}")


def janitor_pid() -> int | None:
    """The janitor's pid, where this process has started one (tests kill the harness and watch it)."""
    return _janitor[1] if _janitor is not None and _janitor[0] == os.getpid() else None


def _clean(cgroups: list[str], dirs: list[str], timeout_s: float = 30.0,
           volumes: tuple[str, ...] = ()) -> None:
    """Kill what is left in the cgroups and remove them, release the volumes, then remove the folders.
    All groups at once, again and again until they are gone: a process belongs to a group in every
    hierarchy, and a frozen one (the harness died during a scoring) takes a SIGKILL only once its
    freezer group is thawed."""
    paths = [Path(root) for p in cgroups for root, _, _ in os.walk(p)]  # with sub-groups made meanwhile
    deadline = time.monotonic() + timeout_s
    while paths and time.monotonic() < deadline:
        for path in paths:
            for name in ("cgroup.procs", "tasks"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in (path / name).read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
        for path in paths:  # thawed after the kills were sent, so that they land
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                with contextlib.suppress(OSError):
                    (path / name).write_text(value)
        for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):  # a sub-group before its parent
            with contextlib.suppress(OSError):
                path.rmdir()
        paths = [p for p in paths if p.exists()]
        if paths:
            time.sleep(0.05)
    for record in volumes:
        from ._volume import release_recorded

        try:
            release_recorded(Path(record))
        except (OSError, ValueError, KeyError) as e:
            logger.warning("janitor: could not release the volume of %s: %s", record, e)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    """Read messages until the harness's end of the pipe closes, then clean what is still tracked."""
    cgroups: dict[str, None] = {}
    dirs: dict[str, None] = {}
    volumes: dict[str, None] = {}
    for raw in sys.stdin.buffer:
        parts = raw.decode(errors="replace").rstrip("\n").split(" ", 2)
        if len(parts) != 3:
            continue
        op, kind, path = parts
        target = {"cgroup": cgroups, "dir": dirs, "volume": volumes}.get(kind)
        if target is None:
            continue
        if op == "track":
            target[path] = None
        elif op == "untrack":
            target.pop(path, None)
    _clean(list(cgroups), list(dirs), volumes=tuple(volumes))


if __name__ == "__main__":
    main()
