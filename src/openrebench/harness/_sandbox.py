"""An Inspect sandbox environment backed by bubblewrap, holding one openrebench run per sample.

`sample_init` sets the run up (assets, workspace, the uncharged scoring of the starting solution)
and starts a scoring service on a Unix socket that the sandbox sees as /run/openrebench/score.sock.
Only the harness scores and writes the score log; the agent's commands run under bubblewrap with
the workspace as their only writable place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Literal

import anyio
from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandboxenv
from pydantic import BaseModel

from openrebench.core import Run, ScoreRow, score_run, start_run
from openrebench.environments import get_environment

from . import _score_client
from ._bwrap import SANDBOX_UID, WORKSPACE, bwrap_binary, bwrap_command

MAX_OUTPUT = 10 * 1024 * 1024


class SandboxConfig(BaseModel, frozen=True):
    """What a sample's sandbox needs: the environment, its tier, where runs go, how to isolate."""

    env_id: str
    tier: str = "mini"
    runs_dir: str = "runs"
    isolation: Literal["bwrap", "local"] = "bwrap"
    network: bool = False
    time_limit_s: float | None = None
    memory_limit_gb: float = 8.0


def format_log(run: Run) -> str:
    env = get_environment(run.info.env_id)
    rows, _ = run.rows()
    out = []
    for r in rows:
        score = "invalid" if r.raw is None else (f"{r.raw:.4f}" if env.score_visible else "valid")
        out.append(f"#{r.index} {r.elapsed_s / 60:6.1f} min  {score:>10}  {r.message.splitlines()[0][:100]}")
    return "\n".join(out) or "no scores yet"


@sandboxenv(name="openrebench")
class OpenRebenchSandbox(SandboxEnvironment):
    def __init__(self, run: Run, config: SandboxConfig, harness_dir: Path) -> None:
        super().__init__()
        self.run = run
        self.config = config
        self.harness_dir = harness_dir
        self.server: asyncio.AbstractServer | None = None
        self._score_lock = asyncio.Lock()

    # -- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandboxConfig(**config)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        if not isinstance(config, SandboxConfig):
            raise ValueError("the openrebench sandbox needs a SandboxConfig")
        if config.isolation == "bwrap" and bwrap_binary() is None:
            raise RuntimeError("bubblewrap is not available; install it or use isolation='local'")
        if config.isolation == "local":
            warnings.warn("openrebench sandbox 'local': NOTHING IS ISOLATED; the agent can read protected "
                          "data and the reference solution", stacklevel=2)
        path = Path(config.runs_dir) / f"{config.env_id}-{config.tier}-{time.strftime('%Y%m%d-%H%M%S')}-" \
                                       f"{uuid.uuid4().hex[:6]}"
        run, _ = await anyio.to_thread.run_sync(lambda: start_run(config.env_id, config.tier, path))
        return {"default": await cls.for_run(run, config)}

    @classmethod
    async def for_run(cls, run: Run, config: SandboxConfig) -> OpenRebenchSandbox:
        """A sandbox over an existing run, with its scoring service started."""
        harness_dir = Path(tempfile.mkdtemp(prefix="orb-"))
        (harness_dir / "bin").mkdir()
        client = harness_dir / "bin" / "score"
        client.write_text(f"#!/usr/bin/env python3\n{Path(_score_client.__file__).read_text()}")
        client.chmod(0o755)
        harness_dir.chmod(0o755)
        if os.geteuid() == 0 and config.isolation == "bwrap":
            for root, dirs, files in os.walk(run.workspace):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.chown(name, SANDBOX_UID, SANDBOX_UID)
        sandbox = cls(run, config, harness_dir)
        await sandbox._start_server()
        return sandbox

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        shutil.rmtree(self.harness_dir, ignore_errors=True)

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, OpenRebenchSandbox):
                await env.close()

    # -- scoring service -----------------------------------------------------------------------------
    async def score(self) -> ScoreRow:
        """Score the workspace now (one scoring at a time per run)."""
        async with self._score_lock:
            return await anyio.to_thread.run_sync(lambda: score_run(self.run))

    def describe(self, row: ScoreRow) -> str:
        return self.run.describe(row, self.config.time_limit_s)

    async def _start_server(self) -> None:
        sock = self.harness_dir / "score.sock"

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                request = json.loads(await reader.readline() or b"{}")
                op = request.get("op") if isinstance(request, dict) else None
                if op == "score":
                    text = self.describe(await self.score())
                elif op == "log":
                    text = format_log(self.run)
                else:
                    text = "unknown request"
            except (ValueError, UnicodeDecodeError):
                text = "malformed request"
            writer.write(json.dumps({"text": text}).encode())
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_unix_server(handle, path=str(sock))
        sock.chmod(0o777)

    # -- the agent's side ----------------------------------------------------------------------------
    def _host_path(self, file: str) -> Path | None:
        """The host path of a workspace file, or None if `file` is outside the workspace."""
        path = Path(file)
        if not path.is_absolute():
            path = Path(WORKSPACE) / path
        try:
            rel = path.resolve().relative_to(WORKSPACE) if str(path).startswith(WORKSPACE) else None
        except ValueError:
            return None
        if rel is None or ".." in rel.parts:
            return None
        host = self.run.workspace / rel
        # A link the agent made must not lead the harness (which may be root) out of the workspace.
        if not host.resolve().is_relative_to(self.run.workspace.resolve()):
            raise PermissionError(f"{file}: leads outside {WORKSPACE}")
        return host

    def _command(self, cmd: list[str], cwd: str | None,
                 env: dict[str, str] | None) -> tuple[list[str], str | None]:
        work = cwd if cwd and cwd.startswith("/") else f"{WORKSPACE}/{cwd}" if cwd else WORKSPACE
        if self.config.isolation == "local":
            host_cwd = self._host_path(work) or self.run.workspace
            return cmd, str(host_cwd)
        spec = get_environment(self.run.info.env_id).tier(self.run.info.tier)
        memory = None if spec.device == "cuda" else int(self.config.memory_limit_gb * 1024**3)
        return bwrap_command(cmd, workspace=self.run.workspace, harness_dir=self.harness_dir, cwd=work,
                             env=env, network=self.config.network, gpu=spec.device == "cuda",
                             max_memory_bytes=memory), None

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        argv, host_cwd = self._command(cmd, cwd, env)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=host_cwd, start_new_session=True,
            env={**os.environ, **(env or {})} if self.config.isolation == "local" else None)
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
            raise PermissionError(f"{file}: only files under {WORKSPACE} can be written")
        data = contents.encode() if isinstance(contents, str) else contents
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data)
        if os.geteuid() == 0 and self.config.isolation == "bwrap":
            os.chown(host, SANDBOX_UID, SANDBOX_UID)

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
