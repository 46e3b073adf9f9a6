"""The bubblewrap backend: the agent's commands run in a bwrap sandbox, inside the attempt's cgroup.

The sandbox sees the system and Python read-only, the workspace and the agent's own dirs writable,
the harness's `score` command and socket, no network unless asked, only the leased GPUs, and none of
the package's reference solutions or calibration records. As root, commands drop to an unprivileged
uid, so root-only files stay unreadable. The cgroup limits memory, processes and CPU time of
everything the attempt runs together (per-process rlimits back it up), and freezes the agent's
processes while a timing-sensitive scoring runs.

Where the run has models, the gateway's socket folder is bound at /run/openrebench/gateway, the run's
token is OPENAI_API_KEY, and each command starts through `gateway-forward --exec`, which listens on
127.0.0.1:4141 of the command's own network namespace (a free port where it has the host's network)
and sets OPENAI_BASE_URL.
"""

from __future__ import annotations

import os
import shlex
import sys

import anyio

from openrebench.gateway import exec_prefix
from openrebench.isolation import SANDBOX_UID, Bind, Cgroup, SandboxSpec, bwrap_command, bwrap_usable
from openrebench.isolation import Limits as ProcessLimits
from openrebench.isolation._bwrap import sandbox_path
from openrebench.runs import get_environment

from .._layout import GATEWAY_DIR, GATEWAY_PORT, HARNESS_DIR, HOME, STATE_DIRS, WORKSPACE
from ._base import Backend, Launch


class BwrapBackend(Backend):
    name = "bwrap"
    description = ("bubblewrap: own filesystem view, no network, own PID namespace, unprivileged uid as "
                   "root, a cgroup for memory, processes and CPU, leased GPUs only")
    leases_gpus = True
    sandboxed_scoring = True
    agent_uid = SANDBOX_UID
    serves_models = True

    @classmethod
    def unusable(cls) -> str | None:
        return bwrap_usable()

    async def start(self) -> None:
        await super().start()
        a = self.attempt
        self.cgroup = Cgroup.create("agent", memory_bytes=a.memory_bytes, max_pids=a.max_processes,
                                    cpus=a.cpus or os.cpu_count())

    async def stop(self) -> None:
        if self.cgroup is not None:
            await anyio.to_thread.run_sync(self.cgroup.close)

    def sandbox_spec(self, cwd: str | None = None, env: dict[str, str] | None = None,
                     interactive: bool = False) -> SandboxSpec:
        a, home = self.attempt, self.attempt.home
        tier = get_environment(a.run.info.env_id).tier(a.run.info.tier)
        work = cwd if cwd and cwd.startswith("/") else f"{WORKSPACE}/{cwd}" if cwd else WORKSPACE
        binds = [Bind(a.run.workspace, WORKSPACE, writable=True),
                 Bind(home.run_dir, HARNESS_DIR),
                 Bind(home.etc / "passwd", "/etc/passwd"),
                 Bind(home.etc / "group", "/etc/group"),
                 *(Bind(home.state(name), dest, writable=True) for name, dest in STATE_DIRS.items())]
        if a.models is not None:
            binds.append(Bind(a.models.socket_dir, GATEWAY_DIR))
        base_env = {"HOME": HOME, "PATH": f"{HARNESS_DIR}/bin:{sandbox_path()}", "TMPDIR": "/tmp",
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton",
                    "TERM": os.environ.get("TERM", "xterm")}
        memory = None if tier.device == "cuda" else a.memory_bytes
        limits = ProcessLimits(max_processes=None if self.cgroup else a.max_processes,
                               max_memory_bytes=memory)
        if a.models is not None:
            base_env.update(a.models.env())
        env_class = get_environment(a.run.info.env_id)
        return SandboxSpec(binds=binds, cwd=work, env={**base_env, **(env or {})}, network=a.network,
                           devices=a.lease.device_nodes() if a.lease else (),
                           limits=limits, new_session=not interactive,
                           tools=[str(t) for t in env_class.host_tools(a.run.info.tier)])

    def command(self, cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                interactive: bool = False) -> Launch:
        if (models := self.attempt.models) is not None:
            port = 0 if self.attempt.network else GATEWAY_PORT
            cmd = [*exec_prefix(f"{GATEWAY_DIR}/{models.socket_name}", port,
                                forwarder=f"{HARNESS_DIR}/bin/gateway-forward", python=sys.executable), *cmd]
        argv = bwrap_command(cmd, self.sandbox_spec(cwd, env, interactive))
        return Launch([*(self.cgroup.enter_prefix() if self.cgroup else []), *argv])

    def login(self) -> str:
        """A script (the attempt's own, mode 700) that execs a login shell in the sandbox."""
        login = self.attempt.home.root / "login"
        shell = self.command(["bash", "--login"], interactive=True).argv
        login.write_text(f"#!/bin/sh\nexec {shlex.join(shell)}\n")
        login.chmod(0o700)
        return str(login)


BACKEND = BwrapBackend
