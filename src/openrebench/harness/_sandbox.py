"""An Inspect sandbox environment backed by bubblewrap, holding one openrebench run per sample.

`sample_init` sets the run up (assets, workspace, the uncharged scoring of the starting solution),
leases the attempt's GPUs, makes a cgroup for its memory and process limits, and starts a scoring
service on a Unix socket that the sandbox sees as /run/openrebench/score.sock. Only the harness
scores (in a second, fresh sandbox) and writes the score log; the agent's commands run under
bubblewrap as an unprivileged uid, with the workspace and its own home and /tmp as the only
writable places.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Literal

import anyio
from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)
from pydantic import BaseModel

from openrebench.api import reporting
from openrebench.isolation import (
    SANDBOX_UID,
    Bind,
    Cgroup,
    GpuLease,
    Limits,
    SandboxSpec,
    bwrap_command,
    bwrap_usable,
)
from openrebench.isolation._bwrap import sandbox_path
from openrebench.runs import Run, ScoreRow, get_environment, score_run, start_run

from . import _score_client
from ._progress import InspectProgress

MAX_OUTPUT = 10 * 1024 * 1024
MAX_REQUEST = 4096  # bytes of one request line on the scoring socket
REQUEST_TIMEOUT_S = 30.0
WORKSPACE = "/workspace"
HARNESS_DIR = "/run/openrebench"
HOME = "/home/agent"
# Writable places of the agent's own, kept for the whole attempt (a shell's files in /tmp survive
# between tool calls; a human agent's tools live in /opt and its session records in /var/tmp).
STATE_DIRS = {"home": HOME, "tmp": "/tmp", "opt": "/opt", "var-tmp": "/var/tmp"}
LOCAL_WARNING = ("openrebench sandbox 'local': NOTHING IS ISOLATED. The agent's commands run as you, "
                 "on your files, with the network; it can read protected data and the reference "
                 "solutions.")

logger = logging.getLogger(__name__)


class SandboxConfig(BaseModel, frozen=True):
    """What a sample's sandbox needs: the environment, its tier, where runs go, how to isolate.

    isolation: `bwrap` (required), `local` (none; a loud warning), or `auto` (bwrap where it
    starts, else local with the warning).
    """

    env_id: str
    tier: str = "mini"
    runs_dir: str = "runs"
    isolation: Literal["auto", "bwrap", "local"] = "auto"
    network: bool = False
    time_limit_s: float | None = None
    memory_limit_gb: float = 8.0
    max_processes: int = 1024
    cpus: float | None = None  # CPU time of the whole attempt, in cores (default: all of them)
    gpu_wait_s: float | None = None


def resolve_isolation(requested: str) -> Literal["bwrap", "local"]:
    if requested == "local":
        return "local"
    problem = bwrap_usable()
    if problem is None:
        return "bwrap"
    if requested == "bwrap":
        raise RuntimeError(f"the bwrap sandbox cannot start here: {problem}")
    return "local"


def _warn_local(reason: str | None) -> None:
    text = LOCAL_WARNING + (f" (bwrap is unusable: {reason})" if reason else "")
    warnings.warn(text, stacklevel=3)
    logger.warning(text)
    print(f"\n!!! {text}\n", file=sys.stderr)


def format_log(run: Run) -> str:
    env = get_environment(run.info.env_id)
    rows, _ = run.rows()
    out = []
    for r in rows:
        score = "invalid" if r.raw is None else (f"{r.raw:.4f}" if env.score_visible else "valid")
        out.append(f"#{r.index} {r.elapsed_s / 60:6.1f} min  {score:>10}  {r.message.splitlines()[0][:100]}")
    return "\n".join(out) or "no scores yet"


def _write_identity(etc: Path) -> None:
    """passwd and group files naming the sandbox uid `agent` with home /home/agent (the host calls
    it nobody, homeless), for tools that look the user up, such as Inspect's human agent."""
    etc.mkdir()
    for name, line in (("passwd", f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:openrebench agent:{HOME}:/bin/bash"),
                       ("group", f"agent:x:{SANDBOX_UID}:")):
        try:
            host = Path("/etc", name).read_text().splitlines()
        except OSError:
            host = []
        kept = [x for x in host if x.split(":")[2:3] != [str(SANDBOX_UID)]]
        (etc / name).write_text("\n".join([*kept, line]) + "\n")
        (etc / name).chmod(0o644)


def _working_clock() -> Any:
    """Inspect's working-time clock of the current sample (excludes model retries and rate-limit
    waits), or None outside a sample or where this Inspect version lacks it."""
    try:
        from inspect_ai._util.working import _sample_timing

        timing = _sample_timing.get()
        return timing if timing is not None and hasattr(timing, "working") else None
    except ImportError:
        return None


def _freeze(group: Cgroup, frozen: bool) -> bool:
    """Freeze or thaw the agent's processes; False (never an exception) where that did not work."""
    try:
        return group.freeze() if frozen else group.thaw()
    except OSError:
        return False


@sandboxenv(name="openrebench")
class OpenRebenchSandbox(SandboxEnvironment):
    def __init__(self, run: Run, config: SandboxConfig, harness_dir: Path, isolation: str,
                 lease: GpuLease | None, cgroup: Cgroup | None) -> None:
        super().__init__()
        self.run = run
        self.config = config
        self.harness_dir = harness_dir
        self.isolation = isolation
        self.lease = lease
        self.cgroup = cgroup
        self.server: asyncio.AbstractServer | None = None
        self._score_lock = asyncio.Lock()
        self._clock: Any = None

    # -- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandboxConfig(**config)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        if not isinstance(config, SandboxConfig):
            raise ValueError("the openrebench sandbox needs a SandboxConfig")
        spec = get_environment(config.env_id).tier(config.tier)
        isolation = resolve_isolation(config.isolation)
        if isolation == "local":
            _warn_local(None if config.isolation == "local" else bwrap_usable())
        lease = None
        if spec.gpu_count and isolation == "bwrap":
            lease = await anyio.to_thread.run_sync(lambda: GpuLease.acquire(
                spec.gpu_count, timeout_s=config.gpu_wait_s, on_wait=logger.warning))
        name = f"{config.env_id}-{config.tier}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        path = Path(config.runs_dir).expanduser().absolute() / name
        try:
            devices = lease.device_nodes() if lease else None
            with reporting(InspectProgress()):  # asset builds show in Inspect's footer
                run, row = await anyio.to_thread.run_sync(
                    lambda: start_run(config.env_id, config.tier, path, sandboxed=isolation == "bwrap",
                                      devices=devices))
            if row is not None and row.details.get("infrastructure"):
                # No baseline: an attempt now would be scored against a broken harness, not the agent.
                raise RuntimeError(f"{run.path}: the starting solution could not be scored: {row.message} "
                                   f"(row #{row.index} of {run.score_log_path})")
            return {"default": await cls.for_run(run, config, isolation=isolation, lease=lease)}
        except BaseException:
            if lease:
                lease.release()
            raise

    @classmethod
    async def for_run(cls, run: Run, config: SandboxConfig, *, isolation: str | None = None,
                      lease: GpuLease | None = None) -> OpenRebenchSandbox:
        """A sandbox over an existing run, with its scoring service started."""
        isolation = isolation or resolve_isolation(config.isolation)
        harness_dir = Path(tempfile.mkdtemp(prefix="orb-"))
        harness_dir.chmod(0o755)
        (harness_dir / "run" / "bin").mkdir(parents=True)
        client = harness_dir / "run" / "bin" / "score"
        client.write_text(f"#!/usr/bin/env python3\n{Path(_score_client.__file__).read_text()}")
        client.chmod(0o755)
        owned = [run.workspace]
        for name in STATE_DIRS:
            (harness_dir / "state" / name).mkdir(parents=True)
            owned.append(harness_dir / "state" / name)
        home = harness_dir / "state" / "home"
        (home / ".bashrc").write_text("PS1='agent:\\w\\$ '\n")
        # A login shell's /etc/profile resets PATH: put the harness's `score` and Python back first.
        (home / ".profile").write_text(f"export PATH={HARNESS_DIR}/bin:{sandbox_path()}\n"
                                       "[ -f ~/.bashrc ] && . ~/.bashrc\n")
        _write_identity(harness_dir / "etc")
        if os.geteuid() == 0 and isolation == "bwrap":
            for top in owned:
                for root, dirs, files in os.walk(top):
                    for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                        os.chown(name, SANDBOX_UID, SANDBOX_UID)
        cgroup = None
        if isolation == "bwrap":
            cgroup = Cgroup.create("agent", memory_bytes=int(config.memory_limit_gb * 1024**3),
                                   max_pids=config.max_processes, cpus=config.cpus or os.cpu_count())
        sandbox = cls(run, config, harness_dir, isolation, lease, cgroup)
        await sandbox._start_server()
        return sandbox

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.cgroup is not None:
            await anyio.to_thread.run_sync(self.cgroup.close)
        if self.lease is not None:
            self.lease.release()
        shutil.rmtree(self.harness_dir, ignore_errors=True)

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, OpenRebenchSandbox):
                await env.close()

    # -- scoring service -----------------------------------------------------------------------------
    def working_time_s(self) -> float | None:
        """Working time so far on Inspect's clock (None outside an Inspect sample)."""
        clock = _working_clock() or self._clock
        if clock is not None:
            self._clock = clock
            return float(clock.working())
        return None

    async def score(self) -> ScoreRow:
        """Score the workspace now (one scoring at a time per run), in a fresh sandbox. Where the score
        is a time, the agent's own processes are frozen meanwhile (and thawed after, whatever happens):
        a busy loop left in the agent's sandbox must not slow the scorer's reference runs (which would
        flatter the solution) nor the solution."""
        elapsed = self.working_time_s()
        group = self.cgroup if get_environment(self.run.info.env_id).timing_sensitive else None
        async with self._score_lock:
            devices = self.lease.device_nodes() if self.lease else None
            try:
                if group is not None and not await anyio.to_thread.run_sync(_freeze, group, True):
                    logger.warning("the agent's processes of %s could not all be frozen", self.run.path)
                return await anyio.to_thread.run_sync(lambda: score_run(
                    self.run, elapsed_s=elapsed, sandboxed=self.isolation == "bwrap", devices=devices))
            finally:
                if group is not None and not await anyio.to_thread.run_sync(_freeze, group, False):
                    logger.warning("the agent's processes of %s could not be thawed", self.run.path)

    def describe(self, row: ScoreRow) -> str:
        return self.run.describe(row, self.config.time_limit_s)

    async def _start_server(self) -> None:
        """The scoring service: every connection gets exactly one one-line JSON answer, whatever it
        sent (garbage, an oversized or unfinished request) and whatever scoring did."""
        sock = self.harness_dir / "run" / "score.sock"

        async def answer(reader: asyncio.StreamReader) -> str:
            try:
                line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
                request = json.loads(line or b"{}")
            except TimeoutError:
                return f"malformed request (no complete line within {REQUEST_TIMEOUT_S:g} s)"
            except (ValueError, UnicodeDecodeError, RecursionError):  # LimitOverrunError is a ValueError
                return f"malformed request (one JSON line of at most {MAX_REQUEST} bytes expected)"
            op = request.get("op") if isinstance(request, dict) else None
            if op == "score":
                try:
                    return self.describe(await self.score())
                except Exception:
                    logger.exception("scoring over the socket failed")
                    return ("Invalid: infrastructure failure (the harness failed while scoring), not caused "
                            "by your solution; the details are in the harness's log.")
            if op == "log":
                try:
                    return format_log(self.run)
                except Exception:
                    logger.exception("reading the score log failed")
                    return "the score log cannot be read right now (infrastructure failure)"
            return "unknown request (expected op 'score' or 'log')"

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                text = await answer(reader)
                writer.write(json.dumps({"text": text}).encode())
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass  # the client went away: nothing to answer to
            finally:
                writer.close()

        self.server = await asyncio.start_unix_server(handle, path=str(sock), limit=MAX_REQUEST)
        sock.chmod(0o777)

    # -- the agent's side ----------------------------------------------------------------------------
    def _host_path(self, file: str) -> Path | None:
        """The host path of a file in the workspace or the agent's own dirs, or None elsewhere."""
        path = Path(file)
        if not path.is_absolute():
            path = Path(WORKSPACE) / path
        places = {WORKSPACE: self.run.workspace,
                  **{dest: self.harness_dir / "state" / name for name, dest in STATE_DIRS.items()}}
        for dest, base in places.items():
            if path == Path(dest) or path.is_relative_to(dest):
                rel = path.relative_to(dest)
                if ".." in rel.parts:
                    return None
                host = base / rel
                # A link the agent made must not lead the harness (which may be root) elsewhere.
                if not host.resolve().is_relative_to(base.resolve()):
                    raise PermissionError(f"{file}: leads outside {dest}")
                return host
        return None

    def sandbox_spec(self, cwd: str | None = None, env: dict[str, str] | None = None,
                     interactive: bool = False) -> SandboxSpec:
        tier = get_environment(self.run.info.env_id).tier(self.run.info.tier)
        work = cwd if cwd and cwd.startswith("/") else f"{WORKSPACE}/{cwd}" if cwd else WORKSPACE
        binds = [Bind(self.run.workspace, WORKSPACE, writable=True),
                 Bind(self.harness_dir / "run", HARNESS_DIR),
                 Bind(self.harness_dir / "etc" / "passwd", "/etc/passwd"),
                 Bind(self.harness_dir / "etc" / "group", "/etc/group"),
                 *(Bind(self.harness_dir / "state" / name, dest, writable=True)
                   for name, dest in STATE_DIRS.items())]
        base_env = {"HOME": HOME, "PATH": f"{HARNESS_DIR}/bin:{sandbox_path()}", "TMPDIR": "/tmp",
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton",
                    "TERM": os.environ.get("TERM", "xterm")}
        memory = None if tier.device == "cuda" else int(self.config.memory_limit_gb * 1024**3)
        limits = Limits(max_processes=None if self.cgroup else self.config.max_processes,
                        max_memory_bytes=memory)
        return SandboxSpec(binds=binds, cwd=work, env={**base_env, **(env or {})},
                           network=self.config.network,
                           devices=self.lease.device_nodes() if self.lease else (),
                           limits=limits, new_session=not interactive)

    def command(self, cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                interactive: bool = False) -> list[str]:
        """The host command line that runs `cmd` inside this sandbox (bwrap isolation only)."""
        argv = bwrap_command(cmd, self.sandbox_spec(cwd, env, interactive))
        return [*(self.cgroup.enter_prefix() if self.cgroup else []), *argv]

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        """Run `cmd` in the sandbox. `user` is ignored: every command runs as the sandbox's one user."""
        self.working_time_s()  # remember the sample's clock for scorings asked over the socket
        if self.isolation == "local":
            host_cwd = self._host_path(cwd or WORKSPACE) or self.run.workspace
            argv, kwargs = cmd, {"cwd": str(host_cwd), "env": {**os.environ, **(env or {})}}
        else:
            argv, kwargs = self.command(cmd, cwd, env), {}
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, **kwargs)
        data = input.encode() if isinstance(input, str) else input
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), timeout)
        except TimeoutError:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise TimeoutError(f"command timed out after {timeout} s") from None
        return ExecResult(success=proc.returncode == 0, returncode=proc.returncode or 0,
                          stdout=out[-MAX_OUTPUT:].decode(errors="replace"),
                          stderr=err[-MAX_OUTPUT:].decode(errors="replace"))

    async def write_file(self, file: str, contents: str | bytes) -> None:
        host = self._host_path(file)
        if host is None:
            raise PermissionError(f"{file}: only files under {WORKSPACE}, {HOME}, /tmp, /opt and "
                                  "/var/tmp can be written")
        data = contents.encode() if isinstance(contents, str) else contents
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data)
        if os.geteuid() == 0 and self.isolation == "bwrap":
            for path in [host, *host.parents]:
                if path in (self.run.workspace, self.harness_dir / "state") or path == path.parent:
                    break
                os.chown(path, SANDBOX_UID, SANDBOX_UID)

    async def read_file(self, file: str, text: bool = True) -> str | bytes:  # type: ignore[override]
        host = self._host_path(file)
        if host is None:
            result = await self.exec(["cat", file])
            if not result.success:
                raise FileNotFoundError(file)
            return result.stdout if text else result.stdout.encode()
        if not host.is_file():
            raise FileNotFoundError(file)
        data = host.read_bytes()
        return data.decode() if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """A login shell in the sandbox, for a person (Inspect's human agent prints this command)."""
        if self.isolation == "local":
            return SandboxConnection(type="openrebench",
                                     command=f"cd {shlex.quote(str(self.run.workspace))} && bash -l")
        login = self.harness_dir / "login"
        shell = self.command(["bash", "--login"], interactive=True)
        login.write_text(f"#!/bin/sh\nexec {shlex.join(shell)}\n")
        login.chmod(0o700)
        return SandboxConnection(type="openrebench", command=str(login))
