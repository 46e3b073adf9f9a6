"""Talking to untrusted solution code in a child process.

The scorer (trusted) starts a *solution host* (a Python module of the environment's) in a child
process and drives it with small JSON messages over a pair of pipes, each framed by a 4-byte length.
Nothing is unpickled, a per-request deadline bounds every wait, and whatever the child does (crash,
hang, exit, garbage on the wire, output on stdout) surfaces as a `SolutionError` with a message that
can be shown to the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_MESSAGE = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")

SOLUTION_UID_ENV = "OPENREBENCH_SOLUTION_UID"
"""Set by the harness in the scoring sandbox, where the scorer is root: the uid of this scoring's own that
the solution's code must run as (never used before or after, by no other trust domain)."""
SOLUTION_USER = "solution"  # its name in the scoring sandbox's passwd


RUN_CGROUP_ENV = "OPENREBENCH_RUN_CGROUP"
"""Set by the harness in the scoring sandbox: the directories (one per cgroup hierarchy, ':'-separated)
of a cgroup made for this scoring's solution processes, which the scorer may fill, freeze and kill."""


def solution_cgroup() -> Any:
    """The cgroup for the solution's processes in this scoring (an `isolation.Cgroup`): the one the
    harness made and bound into the scoring sandbox, else one made here (a root scorer outside a
    sandbox), else None. Nothing a solution does can take its processes out of it; freezing it is the
    one way scorers pause a solution."""
    from openrebench.isolation import Cgroup

    given = [Path(p) for p in os.environ.get(RUN_CGROUP_ENV, "").split(":") if p]
    if given and (group := Cgroup.attach(given)) is not None:
        return group
    return Cgroup.create("solution", memory_bytes=None, max_pids=None)


def solution_uid() -> int | None:
    """The uid the solution's code must run as in this scoring, or None where the scorer and the solution
    share one identity (an unsandboxed scoring, a harness that is not root). Scorers take the identity
    from here, never from a constant of their own."""
    value = os.environ.get(SOLUTION_UID_ENV)
    if not value or os.geteuid() != 0:
        return None
    return int(value)


def solution_prefix() -> list[str]:
    """A command prefix that runs a program as the solution (`solution_uid`), with no capabilities and no
    way back; [] where there is no identity to drop to."""
    uid = solution_uid()
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def become_solution() -> None:
    """Turn this process into the solution's identity for good (where the scorer must touch what the
    solution makes, as CUDA IPC across uids cannot), with no_new_privs; a no-op where there is none."""
    import ctypes

    uid = solution_uid()
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


class SolutionError(Exception):
    """The solution misbehaved; the message is agent-visible."""


def write_message(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int, deadline: float | None = None) -> dict[str, Any]:
    """Read one framed JSON object; raises TimeoutError, EOFError or ValueError (malformed)."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is over the {MAX_MESSAGE}-byte limit")
    message = json.loads(_read_exact(fd, size, deadline))
    if not isinstance(message, dict):
        raise ValueError("message is not a JSON object")
    return message


HOST_PATH_ENV = "OPENREBENCH_HOST_PATH"
# How a solution host starts: isolated (`python -I`: no working directory, user site or PYTHON* variable
# on the import path, so no file of the submission's can stand in for a module the host imports before it
# is told to import the solution), then the scorer's own import path (plug-ins included), then the module.
_BOOT = ("import os, runpy, sys; sys.path[:0] = [p for p in os.environ.pop('" + HOST_PATH_ENV +
         "').split(os.pathsep) if p]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
HOST_START: tuple[str, ...] = ("-I", "-B", "-c", _BOOT)  # the interpreter's arguments before the module


def host_path(solution: Path) -> list[str]:
    """The import path a solution host gets: the scorer's (itself started with -P), without the solution's
    folder or the working directory."""
    banned = {"", ".", str(solution), os.path.realpath(solution)}
    mine = os.path.realpath(solution)
    return [p for p in sys.path if p not in banned and os.path.realpath(p or ".") != mine]


class SolutionProcess:
    """A child process running an environment's solution host module on a solution snapshot.

    The host module runs as `python -I -c BOOT MODULE SOLUTION_DIR READ_FD WRITE_FD`: isolated from the
    submission (nothing of its folder is importable until the host imports the solution by path, when the
    scorer says so; see `_BOOT`), with the solution directory as its working directory and its
    stdout/stderr captured to a private file whose tail is quoted in error messages (so agents see their
    own tracebacks). `pass_fds` are inherited too (e.g. shared memory the scorer owns). With `cgroup`
    (see `solution_cgroup`), the host is in it before any code of its own runs: a gate waits until the
    scorer has moved it there.
    """

    def __init__(self, module: str, solution: Path, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), cgroup: Any = None) -> None:
        self._closed = False
        self._logdir = Path(tempfile.mkdtemp(prefix="openrebench-host-"))
        self.log_path = self._logdir / "output.log"
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        self._read_fd, self._write_fd = parent_read, parent_write
        child_env = {**os.environ, **(env or {}), "PYTHONDONTWRITEBYTECODE": "1",
                     HOST_PATH_ENV: os.pathsep.join(host_path(solution))}
        child_env.pop(SOLUTION_UID_ENV, None)
        # In the scoring sandbox the scorer is root (to read protected data); the solution's code must
        # not be: it runs as the scoring's own uid, without capabilities.
        prefix = solution_prefix()
        gate = ["/bin/sh", "-c", 'read -r _ && exec "$@" </dev/null', "openrebench-gate"] if cgroup else []
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*gate, *prefix, sys.executable, *HOST_START, module, str(solution),
                 str(child_read), str(child_write)],
                cwd=solution, stdin=subprocess.PIPE if cgroup else subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(child_read, child_write, *pass_fds), env=child_env,
                start_new_session=True,
            )
        os.close(child_read)
        os.close(child_write)
        self.cgroup = cgroup
        if cgroup is not None:
            assert self.proc.stdin is not None
            try:
                cgroup.add(self.proc.pid)
            except OSError as e:
                self.proc.kill()
                self.proc.wait()
                raise SolutionError(f"the solution process could not be placed in its cgroup ({e})") from None
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()

    def output_tail(self, lines: int = 15, chars: int = 2000) -> str:
        """The last lines of the solution's output, read from the end of its log only (a solution that
        printed 100 GB must not cost the scorer its memory)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(log.seek(0, os.SEEK_END) - 64 * chars, 0))
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])[-chars:]

    def _died(self) -> SolutionError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            what = "closed its channel to the scorer"
        elif code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"exited with code {code}"
        tail = self.output_tail()
        return SolutionError(f"the solution process {what}" + (f"; its last output:\n{tail}" if tail else ""))

    def send(self, message: dict[str, Any]) -> None:
        try:
            write_message(self._write_fd, message)
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def request(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        """Send one request, wait at most `timeout` s for its reply; raise SolutionError otherwise."""
        self.send(message)
        return self.receive(timeout, what)

    def receive(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            reply = read_message(self._read_fd, time.monotonic() + timeout)
        except TimeoutError:
            raise SolutionError(f"{what} did not finish within {timeout:g} s") from None
        except EOFError:
            raise self._died() from None
        except (ValueError, UnicodeDecodeError, struct.error) as e:
            raise SolutionError(f"malformed message from the solution process ({e}); "
                                "the channel to the scorer must not be written to") from None
        if "error" in reply:
            raise SolutionError(str(reply["error"])[:4000])
        return reply

    def close(self) -> None:
        """End the host and everything it started; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.cgroup is not None:
            self.cgroup.kill_all()  # frozen or not, everything the host started ends (kills land once thawed)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
        self.proc.wait()
        for f in self._logdir.iterdir():
            f.unlink()
        self._logdir.rmdir()

    def __enter__(self) -> SolutionProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostChannel:
    """The child's side of the channel: how a solution host reads requests and answers them."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    @classmethod
    def from_argv(cls) -> tuple[Path, HostChannel]:
        solution, read_fd, write_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        return Path(solution), cls(read_fd, write_fd)

    def receive(self) -> dict[str, Any]:
        return read_message(self.read_fd)

    def send(self, message: dict[str, Any]) -> None:
        write_message(self.write_fd, message)
