"""The Inspect sandbox environment "openrebench": one openrebench run per sample.

`sample_init` sets the run up (assets, workspace, the uncharged scoring of the starting solution),
leases the attempt's GPUs where its backend isolates them, starts the backend (bwrap: a cgroup for
memory and process limits) and the scoring service on a Unix socket that the sandbox sees as
/run/openrebench/score.sock. Only the harness scores (in a second, fresh sandbox) and writes the
score log; the agent's commands and files go through the backend (`backends/`), which under bwrap
runs them as an unprivileged uid with the workspace and its own home and /tmp as the only writable
places.

Where the tier declares models (`TierSpec.models`), the run is granted them on the process's model
gateway (`_run_models.py`): the agent's commands get OPENAI_BASE_URL and a token of their own as
OPENAI_API_KEY, each scoring a grant of its own; the gateway is checked (and started again if it
stopped) before each command and scoring, and the grants are revoked when the sample ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandbox,
    sandboxenv,
)
from pydantic import BaseModel, field_validator

from openrebench.api import reporting
from openrebench.gateway import SOCKET_NAME, install_forwarder
from openrebench.isolation import Cgroup, GpuLease
from openrebench.isolation._machine import SandboxDied
from openrebench.runs import Run, ScoreRow, get_environment, score_run, start_run

from ._layout import AgentHome
from ._progress import InspectProgress
from ._run_models import RunModels
from ._score_service import ScoringService, format_log, install_client
from .backends import (
    Attempt,
    Backend,
    ModelAccess,
    get_backend,
    isolations,
    resolve_isolation,
    warn_unisolated,
)

logger = logging.getLogger(__name__)

AGENT_USER = "agent"  # the one user of an attempt's sandbox (its uid is the attempt's own)


class SandboxConfig(BaseModel, frozen=True):
    """What a sample's sandbox needs: the environment, its tier, where runs go, how to isolate.

    isolation: a backend's name (`bwrap`: required; `local`: none, with a loud warning; installed
    plug-ins), or `auto` (bwrap where it starts, else local with the warning). models: the model of
    each role the user chose (the tier's default for the others); model_budget_*: the run's budget for
    them (default: the tier's).
    """

    env_id: str
    tier: str = "mini"
    runs_dir: str = "runs"
    isolation: str = "auto"
    network: bool = False
    time_limit_s: float | None = None
    memory_limit_gb: float = 8.0
    max_processes: int = 1024
    cpus: float | None = None  # CPU time of the whole attempt, in cores (default: all of them)
    gpu_wait_s: float | None = None
    models: tuple[tuple[str, str], ...] = ()  # (role, model) pairs: Inspect hashes the config
    model_budget_usd: float | None = None
    model_budget_tokens: int | None = None

    @field_validator("models", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        return tuple(sorted(value.items())) if isinstance(value, Mapping) else value

    @field_validator("isolation")
    @classmethod
    def _known_isolation(cls, value: str) -> str:
        if value not in isolations():
            raise ValueError(f"unknown isolation '{value}' (known: {', '.join(isolations())})")
        return value


def _working_clock() -> Any:
    """Inspect's working-time clock of the current sample (excludes model retries and rate-limit
    waits), or None outside a sample or where this Inspect version lacks it."""
    try:
        from inspect_ai._util.working import _sample_timing

        timing = _sample_timing.get()
        return timing if timing is not None and hasattr(timing, "working") else None
    except ImportError:
        return None


@sandboxenv(name="openrebench")
class OpenRebenchSandbox(SandboxEnvironment):
    """One attempt: its run, the agent's host folder, the backend running its commands, its GPU lease
    and the scoring service."""

    def __init__(self, run: Run, config: SandboxConfig, home: AgentHome, backend: Backend,
                 lease: GpuLease | None, models: RunModels | None = None) -> None:
        super().__init__()
        self.run = run
        self.config = config
        self.home = home
        self.backend = backend
        self.lease = lease
        self.models = models
        self.service = ScoringService(score=self._score_text, log=lambda: format_log(self.run))
        self._score_lock = asyncio.Lock()
        self._clock: Any = None

    @property
    def harness_dir(self) -> Path:
        """The host folder of the attempt (see `AgentHome`)."""
        return self.home.root

    @property
    def isolation(self) -> str:
        """The backend's name (what `auto` chose)."""
        return self.backend.name

    @property
    def cgroup(self) -> Cgroup | None:
        return self.backend.cgroup

    # -- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandboxConfig(**config)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        if not isinstance(config, SandboxConfig):
            raise ValueError("the openrebench sandbox needs a SandboxConfig")
        env = get_environment(config.env_id)
        spec = env.tier(config.tier)
        models = RunModels.for_tier(env, config.tier, dict(config.models), config.model_budget_usd,
                                    config.model_budget_tokens)
        backend, passed_over = resolve_isolation(config.isolation)
        if models is not None and not backend.serves_models:
            raise RuntimeError(f"the {backend.name} sandbox cannot give a run its models ({config.env_id} "
                               "declares some)")
        warn_unisolated(backend, passed_over)
        lease = None
        if spec.gpu_count and backend.leases_gpus:
            lease = await anyio.to_thread.run_sync(lambda: GpuLease.acquire(
                spec.gpu_count, timeout_s=config.gpu_wait_s, on_wait=logger.warning))
        name = f"{config.env_id}-{config.tier}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        path = Path(config.runs_dir).expanduser().absolute() / name
        try:
            devices = lease.device_nodes() if lease else None
            with reporting(InspectProgress()):  # asset builds show in Inspect's footer
                run, row = await anyio.to_thread.run_sync(
                    lambda: start_run(config.env_id, config.tier, path, sandboxed=backend.sandboxed_scoring,
                                      devices=devices, access=models.scoring if models else None,
                                      models=models.models if models else None))
            if row is not None and row.details.get("infrastructure"):
                # No baseline: an attempt now would be scored against a broken harness, not the agent.
                raise RuntimeError(f"{run.path}: the starting solution could not be scored: {row.message} "
                                   f"(row #{row.index} of {run.score_log_path})")
            return {"default": await cls.for_run(run, config, isolation=backend.name, lease=lease,
                                                 models=models)}
        except BaseException:
            if models:
                models.close()
            if lease:
                lease.release()
            raise

    @classmethod
    async def for_run(cls, run: Run, config: SandboxConfig, *, isolation: str | None = None,
                      lease: GpuLease | None = None, models: RunModels | None = None) -> OpenRebenchSandbox:
        """A sandbox over an existing run, its backend and scoring service started. `isolation`: a
        backend's name (default: the config's, `auto` resolved here, without the warning). `models`:
        the run's (default: from the config, where its tier declares any), granted here."""
        backend_cls = get_backend(isolation) if isolation else resolve_isolation(config.isolation)[0]
        if models is None:
            env = get_environment(run.info.env_id)
            models = RunModels.for_tier(env, run.info.tier, dict(config.models), config.model_budget_usd,
                                        config.model_budget_tokens)
        if models is not None and not backend_cls.serves_models:
            raise RuntimeError(f"the {backend_cls.name} sandbox cannot give a run its models")
        home = AgentHome.create(run.workspace)
        install_client(home.bin_dir)
        access = None
        try:
            if models is not None:
                grant = await anyio.to_thread.run_sync(lambda: models.agent(run))
                install_forwarder(home.bin_dir)
                home.gateway_mount.mkdir()
                assert grant.socket_dir is not None  # the service gives every grant its own socket
                access = ModelAccess(grant.socket_dir, SOCKET_NAME, grant.token)
        except BaseException:
            if models is not None:
                models.close()
            home.remove()
            raise
        backend = backend_cls(Attempt(run, home, lease, network=config.network,
                                      memory_bytes=int(config.memory_limit_gb * 1024**3),
                                      max_processes=config.max_processes, cpus=config.cpus, models=access))
        try:
            await backend.start()
            box = cls(run, config, home, backend, lease, models)
            await box.service.start(home.socket)
        except BaseException:  # the lease is the caller's to release
            if models is not None:
                models.close()
            await backend.stop()
            home.remove()
            raise
        return box

    async def close(self) -> None:
        if self.models is not None:
            self.models.close()
        self.service.close()
        await self.backend.stop()
        if self.lease is not None:
            self.lease.release()
        self.home.remove()

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, OpenRebenchSandbox):
                await env.close()

    # -- scoring ---------------------------------------------------------------------------------------
    def working_time_s(self) -> float | None:
        """Working time so far on Inspect's clock (None outside an Inspect sample)."""
        clock = _working_clock() or self._clock
        if clock is not None:
            self._clock = clock
            return float(clock.working())
        return None

    async def score(self) -> ScoreRow:
        """Score the workspace now (one scoring at a time per run), in a fresh sandbox, with the agent's
        processes frozen meanwhile and thawed after, whatever happens: the solution's code sees held-out
        data during a scoring, and no live process of the agent may share the machine with it (nor slow a
        timed scoring, nor the scorer's reference runs). An isolating backend that cannot freeze the agent
        refuses the scoring (an infrastructure row saying why); the `none` backend isolates nothing and
        scores unfrozen."""
        elapsed = self.working_time_s()
        async with self._score_lock:
            devices = self.lease.device_nodes() if self.lease else None
            frozen = await anyio.to_thread.run_sync(self.backend.freeze, True)
            try:
                refused = None
                if not frozen and self.backend.isolating:
                    refused = ("the agent's processes could not be frozen for the scoring (" + (
                        "no cgroup freezer here: run as root, or in a delegated cgroup v2 subtree"
                        if frozen is None else "the freezer failed") + ")")
                    logger.warning("%s: %s", self.run.path, refused)
                access = self.models.scoring if self.models else None
                return await anyio.to_thread.run_sync(lambda: score_run(
                    self.run, elapsed_s=elapsed, sandboxed=self.backend.sandboxed_scoring, devices=devices,
                    access=access, refused=refused))
            finally:
                if frozen and await anyio.to_thread.run_sync(self.backend.freeze, False) is False:
                    logger.warning("the agent's processes of %s could not be thawed", self.run.path)

    def describe(self, row: ScoreRow) -> str:
        return self.run.describe(row, self.config.time_limit_s)

    async def _score_text(self) -> str:
        """What the `score` command prints: `score` is looked up per call (tests replace it)."""
        return self.describe(await self.score())

    # -- the agent's side ----------------------------------------------------------------------------
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        """Run `cmd` in the sandbox. Every command runs as the attempt's one user (`agent`): another
        `user` is refused with SandboxUserUnsupportedError, never silently ignored."""
        self._check_user(user)
        self.working_time_s()  # remember the sample's clock for scorings asked over the socket
        await self._gateway_alive()
        try:
            return await self.backend.exec(cmd, input=input, cwd=cwd, env=env, timeout=timeout)
        except SandboxDied as e:
            raise SandboxUnavailableError(str(e)) from None

    def _check_user(self, user: str | None) -> None:
        if user is None or user == AGENT_USER or (self.backend.uid is not None and user == str(self.backend.uid)):
            return
        raise SandboxUserUnsupportedError(
            f"the openrebench sandbox runs every command as its one user '{AGENT_USER}'; it cannot run as "
            f"'{user}' (no root, no other users: the attempt's identity is its isolation)")

    async def _gateway_alive(self) -> None:
        """Start the model gateway again if it stopped (a check of a thread and a file, where it did not)."""
        if self.models is not None and not self.models.service.alive:
            await anyio.to_thread.run_sync(self.models.ensure)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        try:
            await self.backend.write_file(file, contents)
        except SandboxDied as e:
            raise SandboxUnavailableError(str(e)) from None

    async def read_file(self, file: str, text: bool = True) -> str | bytes:  # type: ignore[override]
        self.working_time_s()
        try:
            return await self.backend.read_file(file, text)
        except SandboxDied as e:
            raise SandboxUnavailableError(str(e)) from None

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """A login shell in the sandbox, for a person (Inspect's human agent prints this command)."""
        return SandboxConnection(type="openrebench", command=self.backend.login())


def run_sandbox() -> OpenRebenchSandbox:
    """The current sample's sandbox (for tools, agents and the scorer running in an Inspect sample)."""
    return sandbox().as_type(OpenRebenchSandbox)
