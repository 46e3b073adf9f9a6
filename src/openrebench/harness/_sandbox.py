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
import contextlib
import logging
import os
import threading
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
from openrebench.isolation import Cgroup, GpuLease, SandboxDied, acquire_slot, held_slot
from openrebench.runs import Run, ScoreRow, get_environment, score_run, start_run

from ._attempt import AttemptRecord, claimed, continuable, current_epoch
from ._layout import AgentHome
from ._progress import InspectProgress
from ._run_models import RunModels
from ._score_service import ScoringService, format_log, install_client
from .backends import (
    Backend,
    GatewayAccess,
    SandboxedAttempt,
    get_backend,
    isolations,
    resolve_isolation,
    warn_unisolated,
)

logger = logging.getLogger(__name__)

AGENT_USER = "agent"  # the one user of an attempt's sandbox (its uid is the attempt's own)
HUMAN_STATE = "HumanAgentState"  # where Inspect's human agent keeps its clock in the sample's store
# The module Inspect's human agent service writes for its `task` command, and its last function: a
# person's login waits for it (the login command is printed before the service has started).
HUMAN_AGENT_READY = ("/var/tmp/sandbox-services/human_agent/human_agent.py", "def _human_agent_service_dir(")
RECORD_EVERY_S = 10.0
RESUME_ENV = "OPENREBENCH_RESUME"  # "1": continue unfinished attempts (set by `openrebench eval --resume`)


class SandboxConfig(BaseModel, frozen=True):
    """What a sample's sandbox needs: the environment, its tier, where runs go, how to isolate.

    isolation: a backend's name (`bwrap`; `none`: nothing isolated, said loudly; installed plug-ins), or
    `auto` (an isolating backend, else an error). models: the model of each role the user chose (the
    tier's default for the others); model_budget_*: the run's budget for them (default: the tier's).
    resume: take up an attempt left unfinished in runs_dir (see `_attempt.py`) instead of a new run.
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
    disk_gb: float | None = None  # the attempt's disk of its own (default: the tier's `attempt_disk_bytes`)
    gpu_wait_s: float | None = None
    models: tuple[tuple[str, str], ...] = ()  # (role, model) pairs: Inspect hashes the config
    model_budget_usd: float | None = None
    model_budget_tokens: int | None = None
    agent: str | None = None  # the agent's name, recorded in the run (a resumed attempt matches it)
    resume: bool = False  # continue an unfinished run of this environment in runs_dir, where there is one

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
        self._store: Any = None
        self._ending = threading.Event()  # set when the attempt ends: a scoring under way stops
        self.record = None
        self._saved_at = 0.0

    @property
    def record(self) -> AttemptRecord | None:
        return self._record

    @record.setter
    def record(self, record: AttemptRecord | None) -> None:
        self._record = record
        self._charged_before = record.charged_s if record is not None else 0.0

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
        runs_dir = Path(config.runs_dir).expanduser().absolute()
        path = runs_dir / name
        epoch = current_epoch()
        try:
            devices = lease.device_nodes() if lease else None
            resume = config.resume or os.environ.get(RESUME_ENV) == "1"
            run, record = _resume(runs_dir, config, epoch) if resume else (None, None)
            if run is None:
                with reporting(InspectProgress()):  # asset builds show in Inspect's footer
                    run, row = await anyio.to_thread.run_sync(
                        lambda: start_run(env, config.tier, path,
                                          sandboxed=backend.sandboxed_scoring, devices=devices,
                                          access=models.scoring if models else None,
                                          models=models.models if models else None))
                if row is not None and row.details.get("infrastructure"):
                    # No baseline: an attempt now would be scored against a broken harness, not the agent.
                    raise RuntimeError(f"{run.path}: the starting solution could not be scored: "
                                       f"{row.message} (row #{row.index} of {run.score_log_path})")
                record = AttemptRecord(pid=os.getpid(), host=os.uname().nodename, agent=config.agent,
                                       epoch=epoch)
                record.write(run.path)
            box = await cls.for_run(run, config, isolation=backend.name, lease=lease, models=models)
            box.record = record
            return {"default": box}
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
            models = RunModels.for_tier(run.env, run.info.tier, dict(config.models), config.model_budget_usd,
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
                access = GatewayAccess(grant.socket_dir, SOCKET_NAME, grant.token)
        except BaseException:
            if models is not None:
                models.close()
            home.remove()
            raise
        backend = backend_cls(SandboxedAttempt(run, home, lease, network=config.network,
                                      memory_bytes=int(config.memory_limit_gb * 1024**3),
                                      max_processes=config.max_processes, cpus=config.cpus, models=access,
                                      disk_bytes=int(config.disk_gb * 1024**3) if config.disk_gb
                                      else run.env.tier(run.info.tier).attempt_disk_bytes))
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

    async def close(self, interrupted: bool = False) -> None:
        if self._ending.is_set():
            return  # closed already (an agent's own close, then Inspect's clean-up)
        self._ending.set()  # a scoring under way is stopped (its row says so) before the sandbox goes
        with contextlib.suppress(TimeoutError):
            with anyio.fail_after(60):
                async with self._score_lock:
                    pass
        if self.record is not None:
            used = self.working_time_s() or 0.0
            self._save_record(used, "interrupted" if interrupted else "ended")
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
                await env.close(interrupted)

    # -- scoring ---------------------------------------------------------------------------------------
    def working_time_s(self) -> float | None:
        """Working time so far: the human agent's own clock where a person works (it stops when they
        pause, `task stop`, and a resumed attempt starts it where it was), else Inspect's working clock
        plus what earlier sessions of a resumed attempt charged. None outside an Inspect sample. Saved
        in the run's attempt record every few seconds, so that an interruption loses little."""
        human = self._human_clock()
        if human is not None:
            charged = human
        else:
            clock = _working_clock() or self._clock
            if clock is None:
                return None
            self._clock = clock
            charged = self.charged_before + float(clock.working())
        if self.record is not None and time.monotonic() - self._saved_at > RECORD_EVERY_S:
            self._save_record(charged)
        return charged

    @property
    def charged_before(self) -> float:
        """Working time charged by the earlier sessions of a resumed attempt (0 for a new one)."""
        return self._charged_before

    def _remember_sample(self) -> None:
        """Keep the sample's store (the human agent's clock lives there) for scorings asked over the
        socket."""
        if self._store is None:
            with contextlib.suppress(Exception):
                from inspect_ai.util import store

                self._store = store()

    def _human_clock(self) -> float | None:
        store = self._store
        if store is None or f"{HUMAN_STATE}:running_state" not in store:
            return None
        running = bool(store.get(f"{HUMAN_STATE}:running_state"))
        accumulated = float(store.get(f"{HUMAN_STATE}:accumulated_time") or 0.0)
        started = float(store.get(f"{HUMAN_STATE}:started_running") or time.time())
        return accumulated + (time.time() - started if running else 0.0)

    def _save_record(self, charged: float, state: str = "running") -> None:
        assert self.record is not None
        self.record.charged_s = max(self.record.charged_s, charged)
        self.record.state = state  # type: ignore[assignment]
        with contextlib.suppress(OSError):
            self.record.write(self.run.path)
        self._saved_at = time.monotonic()

    def time_up(self) -> str | None:
        """Why no more scorings are taken (the working time is spent), or None. Agents are stopped by
        Inspect's working limit; a person's clock is the human agent's, which Inspect does not limit."""
        limit = self.config.time_limit_s
        used = self.working_time_s()
        if limit is None or used is None or used < limit:
            return None
        return (f"Your working time is up ({used / 60:.1f} of {limit / 60:.0f} min used): no more scorings. "
                "Run `task submit` to end the attempt.")

    async def score(self) -> ScoreRow:
        """Score the workspace now (one scoring at a time per run), in a fresh sandbox, with the agent's
        processes frozen meanwhile and thawed after, whatever happens: the solution's code sees held-out
        data during a scoring, and no live process of the agent may share the machine with it (nor slow a
        timed scoring, nor the scorer's reference runs). An isolating backend that cannot freeze the agent
        refuses the scoring (an infrastructure row saying why); the `none` backend isolates nothing and
        scores unfrozen."""
        elapsed = self.working_time_s()
        async with self._score_lock:
            # The machine's measurement lock before the freeze, until after the thaw: a calibration of the
            # machine (which freezes every attempt itself) never runs between them.
            slot = await anyio.to_thread.run_sync(acquire_slot)
            with held_slot(slot):
                return await self._score_frozen(elapsed)

    async def _score_frozen(self, elapsed: float | None) -> ScoreRow:
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
                access=access, refused=refused, stop=self._ending))
        finally:
            if frozen and await anyio.to_thread.run_sync(self.backend.freeze, False) is False:
                logger.warning("the agent's processes of %s could not be thawed", self.run.path)

    def describe(self, row: ScoreRow) -> str:
        return self.run.describe(row, self.config.time_limit_s)

    async def _score_text(self) -> str:
        """What the `score` command prints: `score` is looked up per call (tests replace it)."""
        if (up := self.time_up()) is not None:
            return up
        return self.describe(await self.score())

    # -- the agent's side ----------------------------------------------------------------------------
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        """Run `cmd` in the sandbox. Every command runs as the attempt's one user (`agent`): another
        `user` is refused with SandboxUserUnsupportedError, never silently ignored."""
        self._check_user(user)
        self._remember_sample()
        self.working_time_s()  # remember the sample's clock for scorings asked over the socket
        await self._gateway_alive()
        try:
            return await self.backend.exec(cmd, input=input, cwd=cwd, env=env, timeout=timeout)
        except SandboxDied as e:
            raise SandboxUnavailableError(str(e)) from None

    def _check_user(self, user: str | None) -> None:
        own = self.backend.uid is not None and user == str(self.backend.uid)
        if user is None or user == AGENT_USER or own:
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

    def default_polling_interval(self) -> float:
        """How often Inspect's sandbox services (the human agent's `task` commands, `exec_remote`) look
        for requests: Inspect's default of 2 s made each `task` command wait up to 2 s, and a login, which
        runs two, 4 s. Each look is a command in the sandbox (8 ms of CPU): every 0.5 s, a waiting human
        attempt costs 1.5% of a core (every 0.2 s, as Inspect's local and Docker sandboxes, 3.9%)."""
        return 0.5

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """A login shell in the sandbox, for a person (Inspect's human agent prints this command): for the
        human agent, it starts once that agent's `task` command works (`login_shell`)."""
        ready = HUMAN_AGENT_READY if self.config.agent == "human" else None
        return SandboxConnection(type="openrebench", command=self.backend.login(ready))


def _resume(runs_dir: Path, config: SandboxConfig,
            epoch: int | None) -> tuple[Run | None, AttemptRecord | None]:
    """The newest unfinished run of this environment, tier and agent, taken over (its record says so)."""
    with claimed(runs_dir):
        for path in continuable(runs_dir, config.env_id, config.tier, config.agent, epoch):
            record = AttemptRecord.read(path)
            if record is None:
                continue
            run = Run.open(path)
            rows, _ = run.rows()  # a scoring after the record's last save still counts
            record.charged_s = max([record.charged_s, *(r.elapsed_s for r in rows if r.charged)])
            record.state, record.pid, record.host = "running", os.getpid(), os.uname().nodename
            record.resumed += 1
            record.write(path)
            logger.warning("continuing the unfinished attempt in %s (%.1f min charged so far)", path,
                           record.charged_s / 60)
            return run, record
    return None, None


def run_sandbox() -> OpenRebenchSandbox:
    """The current sample's sandbox (for tools, agents and the scorer running in an Inspect sample)."""
    return sandbox().as_type(OpenRebenchSandbox)
