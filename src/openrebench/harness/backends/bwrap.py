"""The bubblewrap backend: one long-lived sandbox per attempt (`isolation.Machine`), which every command,
file read and write, and terminal enters.

The sandbox sees the system and Python read-only, the workspace and the agent's own dirs writable, the
harness's `score` command and socket, no network unless asked, only the leased GPUs, and none of the
package's reference solutions, calibration records or held-out material. It has its own PID, IPC, mount,
UTS and network namespaces, a reaping init, and the seccomp filter that closes the kernel's keyrings. As
root, the attempt's commands run as a uid of its own (never used before on the machine, never again) in a
user namespace of the attempt's. Its cgroup limits memory, processes and CPU time of everything the
attempt runs, and freezes the agent's processes while a scoring runs. What a command starts in the
background lives on until the agent ends it or the attempt ends.

Where the run has models, the gateway's socket folder is bound at /run/openrebench/gateway, the run's
token is OPENAI_API_KEY, and the sandbox keeps `gateway-forward` running on 127.0.0.1:4141 of its own
network namespace (a free port where it shares the host's network), with OPENAI_BASE_URL pointing there.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from inspect_ai.util import ExecResult

from openrebench.base import OpenRebenchError
from openrebench.isolation import (
    IMAGE_NAME,
    Bind,
    Machine,
    MachineSpec,
    OutputLimitExceeded,
    ProcessLimits,
    SandboxSpec,
    Volume,
    allocate_uid,
    bwrap_usable,
    identities_available,
    sandbox_path,
    volume_problem,
)

from .._layout import GATEWAY_DIR, GATEWAY_PORT, HARNESS_DIR, HOME, STATE_DIRS, WORKSPACE
from ._base import MAX_OUTPUT, Backend, _read_limit, login_shell, output_limit_error

logger = logging.getLogger(__name__)

LOGIN_USER_ENV = "OPENREBENCH_LOGIN_USER"


def login_uid() -> int | None:
    """The uid of the person a root harness hands the login to (OPENREBENCH_LOGIN_USER: a name or a uid),
    or None. An unknown name is a one-line error."""
    import pwd

    who = os.environ.get(LOGIN_USER_ENV)
    if not who or os.geteuid() != 0:
        return None
    if who.isdigit():
        return int(who)
    try:
        return pwd.getpwnam(who).pw_uid
    except KeyError:
        raise OpenRebenchError(f"{LOGIN_USER_ENV}={who}: no such user on this machine") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BwrapBackend(Backend):
    name = "bwrap"
    description = ("bubblewrap: one long-lived sandbox per attempt; own filesystem view, PID, IPC, UTS, "
                   "network and user namespaces, a uid of its own as root, keyrings closed, a cgroup for "
                   "memory, processes and CPU, leased GPUs only")
    leases_gpus = True
    sandboxed_scoring = True
    serves_models = True

    def __init__(self, attempt: object) -> None:
        super().__init__(attempt)  # type: ignore[arg-type]
        self.machine: Machine | None = None
        self.base_env: dict[str, str] = {}
        self.volume: Volume | None = None
        self.volume_kept: str | None = None  # where the workspace stayed when it could not be copied back

    @classmethod
    def unusable(cls) -> str | None:
        return bwrap_usable()

    async def start(self) -> None:
        a, home = self.attempt, self.attempt.home
        self.uid = allocate_uid(f"agent {a.run.path}") if identities_available() else None
        home.write_identity(self.uid if self.uid is not None else os.getuid())
        if a.disk_bytes and volume_problem() is None:  # the agent's places on a disk of their own
            try:
                self.volume = await asyncio.get_running_loop().run_in_executor(
                    None, Volume.create, a.run.path / IMAGE_NAME, home.root / "state", a.run.workspace,
                    a.disk_bytes)
            except OSError as e:  # no free loop device in this container, say: the attempt runs without
                logger.warning("%s: the attempt writes on the machine's disk, without a disk of its own "
                               "(%s)", a.run.path, e)
        await super().start()
        tier = a.run.env.tier(a.run.info.tier)
        binds = [Bind(a.run.workspace, WORKSPACE, writable=True),
                 Bind(home.run_dir, HARNESS_DIR),
                 Bind(home.etc / "passwd", "/etc/passwd"),
                 Bind(home.etc / "group", "/etc/group"),
                 *(Bind(home.state(name), dest, writable=True) for name, dest in STATE_DIRS.items())]
        env = {"HOME": HOME, "PATH": f"{HARNESS_DIR}/bin:{sandbox_path()}", "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton",
               "USER": "agent", "LOGNAME": "agent", "TERM": os.environ.get("TERM", "xterm")}
        services: list[list[str]] = []
        if a.models is not None:
            binds.append(Bind(a.models.socket_dir, GATEWAY_DIR))
            port = _free_port() if a.network else GATEWAY_PORT
            env.update(a.models.env())
            env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
            services.append([sys.executable, "-I", "-S", f"{HARNESS_DIR}/bin/gateway-forward",
                             f"{GATEWAY_DIR}/{a.models.socket_name}", str(port)])
        self.base_env = env
        memory = None if tier.device == "cuda" else a.memory_bytes  # GPU drivers map huge address ranges
        spec = SandboxSpec(binds=binds, cwd=WORKSPACE, env=env, network=a.network,
                           devices=a.lease.device_nodes() if a.lease else (),
                           limits=ProcessLimits(max_processes=None, max_memory_bytes=memory),
                           tools=[str(t) for t in
                                  a.run.env.host_tools(a.run.info.tier)])
        self.machine = await Machine.start(MachineSpec(
            spec, uid=self.uid, memory_bytes=a.memory_bytes, max_pids=a.max_processes,
            cpus=a.cpus or os.cpu_count(), name="agent", services=services, cleanup=[home.root],
            volume=self.volume))
        self.cgroup = self.machine.group

    async def stop(self) -> None:
        if self.machine is not None:
            await self.machine.stop()  # the volume released between the kills and the folders' removal
            self.volume_kept = self.machine.volume_kept
        elif self.volume is not None:  # the sandbox never started
            self.volume_kept = await asyncio.get_running_loop().run_in_executor(None, self.volume.release)
        if self.volume_kept:
            logger.warning("%s: the workspace could not be copied back; its files are in %s",
                           self.attempt.run.path, self.volume_kept)

    def freeze(self, frozen: bool) -> bool | None:
        if self.machine is None or not self.machine.can_freeze:
            return None
        return self.machine.freeze(frozen)

    def _machine(self) -> Machine:
        if self.machine is None:
            raise RuntimeError("the attempt's sandbox has not started")
        return self.machine

    def _cwd(self, cwd: str | None) -> str:
        return cwd if cwd and cwd.startswith("/") else f"{WORKSPACE}/{cwd}" if cwd else WORKSPACE

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout: int | None = None) -> ExecResult[str]:
        data = input.encode() if isinstance(input, str) else input
        try:
            out = await self._machine().exec(cmd, input=data, cwd=self._cwd(cwd),
                                             env={**self.base_env, **(env or {})}, timeout=timeout,
                                             limit=MAX_OUTPUT)
        except TimeoutError:
            raise TimeoutError(f"command timed out after {timeout} s") from None
        return ExecResult(success=out.returncode == 0, returncode=out.returncode,
                          stdout=out.stdout.decode(errors="replace"),
                          stderr=out.stderr.decode(errors="replace"))

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read as the agent, inside the sandbox: its permissions decide, and a link it planted leads
        only where it could go itself."""
        try:
            data = await self._machine().read_file(self._cwd(file) if not file.startswith("/") else file,
                                                   _read_limit())
        except OutputLimitExceeded as e:
            raise output_limit_error(e.size) from None
        except OSError as e:
            raise type(e)(e.errno or errno.EIO, e.strerror or str(e), file) from None
        return data.decode() if text else data

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write as the agent, inside the sandbox (folders made as needed), so the file is the agent's."""
        data = contents.encode() if isinstance(contents, str) else contents
        try:
            await self._machine().write_file(self._cwd(file) if not file.startswith("/") else file, data)
        except OSError as e:
            raise type(e)(e.errno or errno.EIO, e.strerror or str(e), file) from None

    def login(self, ready: tuple[str, str] | None = None) -> str:
        """A script (the attempt's own, mode 700) that opens a terminal in the sandbox: a login shell on
        a pty of the sandbox, relayed to the caller's terminal. Any number may be open at once.

        It is the harness user's; a harness run as root gives it (and the sandbox's control socket) to the
        person named by OPENREBENCH_LOGIN_USER (`openrebench eval --login-user NAME`), so that an expert
        logs in as themselves. The relay needs only the standard library: the system's Python runs it
        where there is one (a virtual environment under root's home is closed to others)."""
        machine = self._machine()
        login = self.attempt.home.root / "login"
        request = machine.terminal_request(login_shell(ready), self.base_env)
        attach = Path(__file__).resolve().parents[2] / "isolation" / "_attach.py"
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        argv = [python, "-I", "-S", str(attach), str(machine.socket_path), json.dumps(request)]
        login.write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")
        login.chmod(0o700)
        if (person := login_uid()) is not None:
            for path in (login, machine.control, machine.socket_path):
                os.chown(path, person, -1)
        return str(login)


BACKEND = BwrapBackend
