"""What a sandbox backend is: how the agent's commands run, and what keeps them apart from the host.

The Inspect sandbox (`_sandbox.py`) owns the attempt's lifecycle (the run, the GPU lease, the
scoring service); a backend only runs the agent's commands and moves its files, with one
`SandboxedAttempt`'s settings. A backend's class says what it does in class attributes, read by the harness
instead of branching on names; its name is what `--isolation` and `-T isolation=` take.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shlex
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from inspect_ai.util import ExecResult

from openrebench.isolation import Cgroup, GpuLease
from openrebench.runs import Run

from .._layout import HOME, WORKSPACE, AgentHome

MAX_OUTPUT = 10 * 1024 * 1024


@dataclass(frozen=True)
class GatewayAccess:
    """A run's way to its models: the host folder holding the gateway's socket, the socket's name in it,
    and the run's token, the command's OPENAI_API_KEY. A backend shows the socket to the agent's
    commands and starts each through `gateway-forward --exec`, which sets OPENAI_BASE_URL."""

    socket_dir: Path
    socket_name: str
    token: str = field(repr=False)

    def env(self) -> dict[str, str]:
        return {"OPENAI_API_KEY": self.token}


@dataclass(frozen=True)
class SandboxedAttempt:
    """What a backend isolates: one run's agent, the host folder of its own places, its GPUs, its limits."""

    run: Run
    home: AgentHome
    lease: GpuLease | None = None
    network: bool = False
    memory_bytes: int = 8 * 1024**3
    max_processes: int = 1024
    cpus: float | None = None  # CPU time of the whole attempt, in cores (None: all of them)
    models: GatewayAccess | None = None  # where the run's tier declares models
    disk_bytes: int | None = None  # the attempt's disk of its own, where the backend can make one


@dataclass(frozen=True)
class Launch:
    """A host command line running one command of the agent, with the host cwd and environment it
    needs (None: the harness's own)."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None


def _freeze(group: Cgroup, frozen: bool) -> bool:
    """Freeze or thaw the agent's processes; False (never an exception) where that did not work."""
    try:
        return group.freeze() if frozen else group.thaw()
    except OSError:
        return False


def _read_limit() -> int:
    from inspect_ai.util import SandboxEnvironmentLimits

    return int(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)


def output_limit_error(size: int | None) -> Exception:
    """Inspect's error for a file read over its limit (`INSPECT_SANDBOX_MAX_READ_FILE_SIZE`)."""
    from inspect_ai.util import OutputLimitExceededError, SandboxEnvironmentLimits

    return OutputLimitExceededError(limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                                    truncated_output=None)


def _tail(fd: int, limit: int = MAX_OUTPUT) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, limit, max(0, size - limit))


class Backend(ABC):
    """Runs one attempt's commands. Subclasses set the class attributes and either `command` (one host
    process per command, as the `none` backend) or `exec`, `read_file` and `write_file` themselves (a
    long-lived sandbox, as bwrap), and may override `start`/`stop` for what they set up and tear down."""

    name: ClassVar[str]
    description: ClassVar[str]  # one line: what it isolates, for people choosing one
    warning: ClassVar[str | None] = None  # said loudly whenever an attempt uses it (nothing isolated)
    isolating: ClassVar[bool] = True  # False: nothing is isolated (refused unless asked for by name)
    leases_gpus: ClassVar[bool] = False  # the attempt leases its GPUs and sees only those
    sandboxed_scoring: ClassVar[bool] = False  # scorings run in the scoring sandbox (bwrap)
    serves_models: ClassVar[bool] = False  # honours `SandboxedAttempt.models` (a run with models needs it)

    def __init__(self, attempt: SandboxedAttempt) -> None:
        self.attempt = attempt
        self.cgroup: Cgroup | None = None  # holds every process of the agent, where the backend makes one
        self.uid: int | None = None  # the agent's own uid, where the backend gives it one

    @classmethod
    def unusable(cls) -> str | None:
        """Why this backend cannot start on this machine, or None where it can."""
        return None

    def owner(self) -> int | None:
        """The uid to give the agent's files to, or None where they stay the harness's."""
        return self.uid if self.uid is not None and os.geteuid() == 0 else None

    async def start(self) -> None:
        """Set the attempt up before its first command; the agent's places become its own."""
        if (uid := self.owner()) is not None:
            self.attempt.home.chown(uid)

    async def stop(self) -> None:  # noqa: B027 - optional: a backend may have nothing to tear down
        """Tear down what `start` made (called once, at the end of the attempt)."""

    def freeze(self, frozen: bool) -> bool | None:
        """Freeze (or thaw) every process of the agent; None where this backend cannot, False where
        it failed this time."""
        return None if self.cgroup is None else _freeze(self.cgroup, frozen)

    def command(self, cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                interactive: bool = False) -> Launch:
        """The host command line that runs `cmd` as the agent (`cwd` as the agent sees it)."""
        raise NotImplementedError(f"the {self.name} backend runs commands itself (exec)")

    @abstractmethod
    def login(self, ready: tuple[str, str] | None = None) -> str:
        """A shell command giving a person a login shell as the agent (Inspect's human agent prints it).
        `ready` = (path, text): the shell starts once that file in the sandbox holds that text (see
        `login_shell`)."""

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout: int | None = None) -> ExecResult[str]:
        """Run `cmd` as the agent through `command`: the result comes when its main process exits (what
        it leaves in the background keeps its output files: memory files, never pipes that would hold
        the reply open); on timeout its whole session is killed."""
        launch = self.command(cmd, cwd, env)
        data = input.encode() if isinstance(input, str) else input
        stdin = os.memfd_create("stdin")
        out, err = os.memfd_create("stdout"), os.memfd_create("stderr")
        try:
            if data:
                os.write(stdin, data)
                os.lseek(stdin, 0, os.SEEK_SET)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv, stdin=stdin if data is not None else asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True, cwd=launch.cwd, env=launch.env)
            except FileNotFoundError:
                return ExecResult(success=False, returncode=127, stdout="",
                                  stderr=f"{cmd[0]}: command not found\n")
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                raise TimeoutError(f"command timed out after {timeout} s") from None
            code = proc.returncode or 0
            code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as shells say
            return ExecResult(success=code == 0, returncode=code,
                              stdout=_tail(out).decode(errors="replace"),
                              stderr=_tail(err).decode(errors="replace"))
        finally:
            for fd in (stdin, out, err):
                os.close(fd)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write a file in the workspace or the agent's own dirs, owned as the agent's own are."""
        home = self.attempt.home
        host = home.host_path(file)
        if host is None:
            raise PermissionError(errno.EACCES, f"only files under {WORKSPACE}, {HOME}, /tmp, /opt and "
                                  "/var/tmp can be written", file)
        if host.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory", file)
        data = contents.encode() if isinstance(contents, str) else contents
        host.parent.mkdir(parents=True, exist_ok=True)
        try:
            host.write_bytes(data)
        except PermissionError:
            raise PermissionError(errno.EACCES, "permission denied", file) from None
        if (uid := self.owner()) is not None:
            for path in [host, *host.parents]:
                if path in (home.workspace, home.root / "state") or path == path.parent:
                    break
                os.chown(path, uid, uid)

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """A file as the agent sees it: its own places from the host, anything else from the host too
        (this backend isolates nothing)."""
        host = self.attempt.home.host_path(file) or Path(file)
        if host.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory", file)
        try:
            size = host.stat().st_size
            if size > _read_limit():
                raise output_limit_error(size)
            data = host.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such file", file) from None
        except PermissionError:
            raise PermissionError(errno.EACCES, "permission denied", file) from None
        return data.decode() if text else data


def login_shell(ready: tuple[str, str] | None) -> list[str]:
    """A login shell, started once `ready` = (path, text) holds: Inspect's human agent prints its login
    command before its service has written the module its `task` command imports, and the login's
    .bashrc runs `task start` at once. On a busy machine (or with a scoring started first, which freezes
    the service's own commands) that came too late: the clock stayed stopped and `task submit` failed."""
    if ready is None:
        return ["bash", "--login"]
    path, text = (shlex.quote(x) for x in ready)
    wait = (f"i=0; until grep -qsF -- {text} {path}; do i=$((i+1)); "
            "if [ $i = 20 ]; then echo 'waiting for the task command to be ready...'; fi; "
            "if [ $i -gt 1200 ]; then echo 'the task command is not ready after 2 minutes; logging in "
            "anyway'; break; fi; sleep 0.1; done; exec bash --login")
    return ["bash", "-c", wait]
