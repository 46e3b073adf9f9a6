"""One long-lived sandbox per attempt: a machine the agent's commands enter, not a sandbox per command.

`Machine.start` builds the sandbox once: bubblewrap with its own PID, IPC, mount, UTS and network
namespaces (and, as root, a uid of the attempt's own plus a user namespace the commands join), the
seccomp filter, bubblewrap's reaping init as PID 1 and the exec server (`_execd.py`) as PID 2, all in
the attempt's cgroup. Every command, file read, file write and terminal goes to the exec server, which
forks it inside, so what a command starts in the background lives on until the agent ends it or the
attempt ends, as in a container.

The cgroup has two levels: the sandbox's (bubblewrap, its init, the exec server) and, below it, the
agent's (every command and what it starts). ProcessLimits sit on the sandbox's; freezing acts on the agent's,
so a frozen attempt's server still accepts commands (which start frozen and run once thawed) and the
harness's own pollers never see a dead sandbox. A command's timeout does not count time frozen.

Teardown kills the whole cgroup and removes it with the attempt's folders; if the harness dies first,
bubblewrap dies with the thread that started it (--die-with-parent; that thread lives as long as the
sandbox) and the janitor removes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import _janitor
from ._bwrap import PRIVATE_DIR, Bind, SandboxSpec, bwrap_command
from ._cgroup import Cgroup
from ._quiet import registered
from ._volume import RECORD_NAME, Volume

logger = logging.getLogger(__name__)

MAX_OUTPUT = 10 * 1024 * 1024
START_TIMEOUT_S = 60.0


class SandboxDied(RuntimeError):
    """The attempt's sandbox is no longer running (an infrastructure failure, not a command's)."""


class OutputLimitExceeded(Exception):
    """A file read over the caller's limit (the harness maps it to Inspect's error)."""

    def __init__(self, message: str, size: int | None) -> None:
        super().__init__(message)
        self.size = size


@dataclass(frozen=True)
class ExecOutput:
    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False


@dataclass
class MachineSpec:
    """What the sandbox is: the bwrap spec of its commands (binds, environment, devices, tools), its
    identity (`uid`: the agent's uid where the harness is root, else None) and its cgroup limits."""

    sandbox: SandboxSpec
    uid: int | None = None
    memory_bytes: int | None = None
    max_pids: int | None = None
    cpus: float | None = None
    user_namespace: bool = True
    name: str = "attempt"
    log_dir: Path | None = None  # where bubblewrap's own messages go (default: the control folder)
    cleanup: list[Path] = field(default_factory=list)  # folders removed with the sandbox
    services: list[list[str]] = field(default_factory=list)  # kept running as the agent (restarted on exit)
    # The attempt's disk of its own (`_volume`): released (the workspace copied back) once the agent's
    # processes are gone and before the cleanup folders go; its record sits in the first cleanup folder.
    volume: Volume | None = None


_OPEN_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError,
    "IsADirectoryError": IsADirectoryError, "NotADirectoryError": NotADirectoryError,
    "FileExistsError": FileExistsError,
}


def _raise(reply: dict, path: str | None = None) -> None:
    name, message = reply.get("error", "OSError"), reply.get("message", "")
    if name == "OutputLimitExceeded":
        raise OutputLimitExceeded(message, reply.get("size"))
    cls = _OPEN_ERRORS.get(name)
    if cls is None and reply.get("errno"):
        import errno as errno_mod

        cls = {errno_mod.ENOENT: FileNotFoundError, errno_mod.EACCES: PermissionError,
               errno_mod.EPERM: PermissionError, errno_mod.EISDIR: IsADirectoryError,
               errno_mod.ENOTDIR: NotADirectoryError}.get(reply["errno"])
    cls = cls or OSError
    err = reply.get("errno") or 0
    if path is not None:
        raise cls(err, f"{message or name}", path)
    raise cls(err, message or name)


class Machine:
    """A running sandbox. Make one with `await Machine.start(spec)`; end it with `await stop()`."""

    def __init__(self, spec: MachineSpec, control: Path, group: Cgroup | None, agent: Cgroup | None) -> None:
        self.spec = spec
        self.control = control  # root-only host folder: the exec socket, bubblewrap's log
        self.socket_path = control / "exec.sock"
        self.group = group
        self.agent_group = agent
        self.proc: subprocess.Popen[bytes] | None = None
        self.server_pid: int | None = None
        self.userns = False
        self._thread: threading.Thread | None = None
        self._exited = threading.Event()
        self._frozen_since: float | None = None
        self._frozen_total = 0.0
        self._stopped = False
        self.volume_kept: str | None = None  # where the workspace stayed when it could not be copied back
        # Known to a calibration on this machine (`_quiet`), which freezes the agent while it measures.
        self._registration = contextlib.ExitStack()
        if agent is not None:
            self._registration.enter_context(registered(agent.dirs))

    # -- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    async def start(cls, spec: MachineSpec) -> Machine:
        control = Path(tempfile.mkdtemp(prefix="orb-ctl-"))
        control.chmod(0o700)
        _janitor.track("dir", control)
        if spec.volume is not None and spec.cleanup:  # before the folders: the janitor releases it first
            spec.volume.record(spec.cleanup[0] / RECORD_NAME)
            _janitor.track("volume", spec.cleanup[0] / RECORD_NAME)
        for folder in spec.cleanup:
            _janitor.track("dir", folder)
        group = agent = None
        try:
            group = Cgroup.create(spec.name, memory_bytes=spec.memory_bytes, max_pids=spec.max_pids,
                                  cpus=spec.cpus)
            if group is not None:
                for d in group.dirs:
                    _janitor.track("cgroup", d)
                agent = group.child("agent")
                for d in agent.dirs:
                    _janitor.track("cgroup", d)
            machine = cls(spec, control, group, agent)
            await asyncio.get_running_loop().run_in_executor(None, machine._launch)
            return machine
        except BaseException:
            if agent is not None:
                agent.close()
            if group is not None:
                group.close()
            shutil.rmtree(control, ignore_errors=True)
            raise

    def _launch(self) -> None:
        """Start bubblewrap from a thread that lives as long as the sandbox (--die-with-parent follows the
        starting thread) and wait until the exec server listens."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(64)
        ready_r, ready_w0 = os.pipe()
        # Above 9: bwrap_command's own wrapper opens the seccomp filter on descriptor 9.
        listen_fd = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
        ready_w = fcntl.fcntl(ready_w0, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(ready_w0)
        config = {"fd": listen_fd, "uid": self.spec.uid, "userns": self.spec.user_namespace,
                  "cwd": self.spec.sandbox.cwd, "ready_fd": ready_w,
                  "services": [{"argv": argv, "env": dict(self.spec.sandbox.env)}
                               for argv in self.spec.services],
                  "cgroup_procs": [f"{PRIVATE_DIR}/cgroup{i}/cgroup.procs"
                                   for i in range(len(self.agent_group.dirs) if self.agent_group else 0)]}
        server = [sys.executable, "-I", "-S", str(Path(__file__).with_name("_execd.py")), json.dumps(config)]
        if os.geteuid() == 0:
            # The server stays root (to drop each command to the agent's uid, to write its cgroup) with no
            # capability but switching uids, killing its commands and mapping root into the attempt's user
            # namespace (CAP_SETFCAP, which the kernel asks of whoever maps uid 0): the agent's uid cannot
            # signal, trace or read it.
            server = ["setpriv", "--inh-caps=-all", "--bounding-set=-all,+setuid,+setgid,+setfcap,+kill",
                      "--", *server]
        private = [Bind(d, f"cgroup{i}", writable=True)
                   for i, d in enumerate(self.agent_group.dirs if self.agent_group else [])]
        spec = self.spec.sandbox
        sandbox = SandboxSpec(binds=spec.binds, cwd=spec.cwd, env=spec.env, network=spec.network,
                              devices=spec.devices, limits=spec.limits, drop_privileges=False,
                              new_session=True, plugins=spec.plugins, tools=spec.tools, seccomp=spec.seccomp,
                              private_binds=private)
        argv = [*(self.group.enter_prefix() if self.group else []), *bwrap_command(server, sandbox)]
        log = open(self._log_path(), "ab")  # noqa: SIM115 - handed to the thread that starts bubblewrap
        started = threading.Event()
        failure: list[BaseException] = []

        def hold() -> None:
            try:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             pass_fds=(listen_fd, ready_w), start_new_session=True)
            except BaseException as e:
                failure.append(e)
                started.set()
                return
            finally:
                log.close()
            started.set()
            self.proc.wait()
            self._exited.set()

        self._thread = threading.Thread(target=hold, name=f"sandbox-{self.spec.name}", daemon=True)
        self._thread.start()
        started.wait()
        listener.close()
        os.close(listen_fd)
        os.close(ready_w)
        if failure:
            os.close(ready_r)
            raise SandboxDied(f"the sandbox could not start: {failure[0]}")
        line = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        import select

        ready = select.poll()  # not select.select: descriptors past 1023 (the harness raises its limit)
        ready.register(ready_r, select.POLLIN)
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if ready.poll(200):
                chunk = os.read(ready_r, 4096)
                if not chunk:
                    break
                line += chunk
        os.close(ready_r)
        if not line.endswith(b"\n"):
            self._kill()
            raise SandboxDied(f"the sandbox did not start: {self.log_tail() or 'no message'}")
        info = json.loads(line)
        self.userns = bool(info.get("userns"))
        self._protect()

    def _protect(self) -> None:
        """Keep the attempt's own out-of-memory kills off bubblewrap, its init and the exec server (the
        commands reset their own score): a dead sandbox would end the attempt."""
        if os.geteuid() != 0 or self.group is None:
            return
        agent = self.agent_group.pids() if self.agent_group else set()
        for pid in self.group.pids() - agent:
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")

    def _log_path(self) -> Path:
        return (self.spec.log_dir or self.control) / "sandbox.log"

    def log_tail(self, chars: int = 600) -> str:
        path = self._log_path()
        try:
            return path.read_text(errors="replace").strip()[-chars:]
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self._exited.is_set()

    def _kill(self) -> None:
        # The agent's group first: it may be frozen (an attempt ended during a scoring), and its own
        # freezer decides whether kills land.
        for group in (self.agent_group, self.group):
            if group is not None:
                group.kill_all()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, 9)
        self._exited.wait(10)

    async def stop(self) -> None:
        """Kill everything of the sandbox and remove its cgroups and folders (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await asyncio.get_running_loop().run_in_executor(None, self._teardown)

    def _teardown(self) -> None:
        self._registration.close()
        self._kill()
        for group in (self.agent_group, self.group):
            if group is not None:
                group.close()
                for d in group.dirs:
                    _janitor.untrack("cgroup", d)
        if self.spec.volume is not None:
            try:
                self.volume_kept = self.spec.volume.release()
            except OSError as e:  # the copy is made or the image kept: never the agent's files lost
                self.volume_kept = f"{self.spec.volume.image} ({e})"
            if self.spec.cleanup:
                _janitor.untrack("volume", self.spec.cleanup[0] / RECORD_NAME)
        for folder in [self.control, *self.spec.cleanup]:
            shutil.rmtree(folder, ignore_errors=True)
            _janitor.untrack("dir", folder)

    # -- freezing ------------------------------------------------------------------------------------
    @property
    def can_freeze(self) -> bool:
        return self.agent_group is not None and self.agent_group.can_freeze

    def freeze(self, frozen: bool) -> bool:
        """Freeze (or thaw) every process of the agent; False where that did not work. Time frozen is
        not counted against a command's timeout."""
        if self.agent_group is None:
            return False
        try:
            ok = self.agent_group.freeze() if frozen else self.agent_group.thaw()
        except OSError:
            ok = False
        now = time.monotonic()
        if frozen and ok and self._frozen_since is None:
            self._frozen_since = now
        elif not frozen and self._frozen_since is not None:
            self._frozen_total += now - self._frozen_since
            self._frozen_since = None
        return ok

    def frozen_s(self) -> float:
        """Seconds the agent has been frozen since the sandbox started."""
        current = time.monotonic() - self._frozen_since if self._frozen_since is not None else 0.0
        return self._frozen_total + current

    # -- requests ------------------------------------------------------------------------------------
    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not self.alive:
            raise SandboxDied(self._death())
        try:
            return await asyncio.open_unix_connection(str(self.socket_path), limit=16 << 20)
        except OSError as e:
            why = self._death() if not self.alive else f"the sandbox's exec server is unreachable ({e})"
            raise SandboxDied(why) from None

    def _death(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        tail = self.log_tail(300)
        return (f"the attempt's sandbox has stopped (exit status {code})" + (f": {tail}" if tail else "")
                + "; this is an infrastructure failure")

    async def _reply(self, reader: asyncio.StreamReader) -> dict:
        line = await reader.readline()
        if not line:
            raise SandboxDied(self._death() if not self.alive else "the sandbox's exec server closed the "
                              "connection without a reply")
        return json.loads(line)

    async def _until(self, coro: asyncio.Future | asyncio.Task, timeout: float | None) -> object:
        """Await `coro` for at most `timeout` seconds of time not frozen."""
        task = asyncio.ensure_future(coro)
        if timeout is None:
            return await task
        start, frozen_at_start = time.monotonic(), self.frozen_s()
        try:
            while True:
                used = time.monotonic() - start - (self.frozen_s() - frozen_at_start)
                left = timeout - used
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait([task], timeout=min(left, 1.0))
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def exec(self, argv: list[str], *, input: bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout: float | None = None,
                   limit: int = MAX_OUTPUT) -> ExecOutput:
        """Run `argv` in the sandbox; returns when its main process exits. On timeout (counted without
        time frozen) its session is killed and TimeoutError raised. A command that cannot be executed
        raises PermissionError (not executable) or returns 127 (not found)."""
        reader, writer = await self._connect()
        try:
            header = {"op": "exec", "argv": argv, "cwd": cwd, "env": env or {}, "limit": limit,
                      "stdin": None if input is None else len(input)}
            writer.write(json.dumps(header).encode() + b"\n")
            if input:
                writer.write(input)
            await writer.drain()

            async def result() -> ExecOutput:
                reply = await self._reply(reader)
                if not reply.get("ok"):
                    if reply.get("error") == "FileNotFoundError":
                        return ExecOutput(127, b"", f"{argv[0]}: command not found\n".encode())
                    _raise(reply, argv[0])
                out = await reader.readexactly(reply["stdout"])
                err = await reader.readexactly(reply["stderr"])
                return ExecOutput(reply["rc"], out, err, bool(reply.get("truncated")))

            try:
                return await self._until(result(), timeout)  # type: ignore[return-value]
            except TimeoutError:
                # Ask for the kill and wait until it is done: the caller sees a command that has ended.
                with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError, SandboxDied):
                    writer.write(b"k")
                    await writer.drain()
                    await asyncio.wait_for(self._reply(reader), 15)
                raise
        finally:
            writer.close()  # before a reply: the server kills the command's session

    async def read_file(self, path: str, limit: int) -> bytes:
        """The file as the agent can read it (opened as the agent inside); errors as Python's."""
        reader, writer = await self._connect()
        try:
            writer.write(json.dumps({"op": "read", "path": path, "limit": limit}).encode() + b"\n")
            await writer.drain()
            reply = await self._reply(reader)
            if not reply.get("ok"):
                _raise(reply, path)
            return await reader.readexactly(reply["size"])
        finally:
            writer.close()

    async def write_file(self, path: str, data: bytes) -> None:
        """Write the file as the agent (parents made as needed); errors as Python's."""
        reader, writer = await self._connect()
        try:
            writer.write(json.dumps({"op": "write", "path": path, "size": len(data)}).encode() + b"\n")
            writer.write(data)
            await writer.drain()
            reply = await self._reply(reader)
            if not reply.get("ok"):
                _raise(reply, path)
        finally:
            writer.close()

    def terminal_request(self, argv: Sequence[str], env: dict[str, str], cwd: str | None = None) -> dict:
        """The request a terminal client (`_attach.py`) sends to open a shell on a pty in the sandbox."""
        return {"op": "tty", "argv": list(argv), "env": env, "cwd": cwd}
