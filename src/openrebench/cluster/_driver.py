"""The driver: attempts from the durable queue to Ray tasks and back, with retries, node losses,
per-node asset preparation and live progress.

Each attempt is one Ray task asking for its tier's GPUs, CPUs and memory (`attempt_resources`), so Ray
never gives one GPU to two attempts and holds attempts in its queue while the cluster is full. Ray's
own retries are off (`max_retries=0`): a try whose node died comes back here as a `NodeDiedError`, so
that its partial run is marked (`cluster-lost.jsonl` in the try's folder) before the attempt is queued
again; Ray schedules the new try wherever resources are free, which is never the dead node.

Logs and runs live on shared storage (the same path on every node and the driver): a try writes its
Inspect log into its own folder under the runs directory, and only the driver moves a finished log
into the log directory (done, or failed with no tries left), then commits the queue, so the log
directory holds one log per attempt and an orphaned try (its driver gone) can never add a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from openrebench.base import OpenRebenchError

from ._node import (
    LOST_FILE,
    RESULT_FILE,
    START_FILE,
    _write_line,
    one_line,
    prepare_assets,
    read_line,
    run_attempt,
)
from ._progress import Progress
from ._queue import AttemptQueue
from ._spec import AttemptSpec, Resources, attempt_resources

QUEUE_FILE = "openrebench-cluster.sqlite"
"""The queue's file in the log directory (Inspect lists only .eval and .json files as logs)."""
LOCK_FILE = "openrebench-cluster.lock"
FORWARDED = re.compile(r"_(API_KEY|BASE_URL)$")
"""Variables the driver passes to every attempt (Ray's runtime_env): provider keys and endpoints, so the
nodes need none of their own. Ray keeps them with the job: a cluster shared with others sees them."""
AUTH_REFUSED = re.compile(r"AuthenticationError|InvalidAuthToken|Unauthenticated")
"""How Ray says that the cluster wants a token this driver did not give: an `AuthenticationError` (token
mode with no token here), or, for a wrong token or none sent, a ConnectionError after 20 tries whose cause
(the GCS client's last error) names it."""
AUTH_HELP = ("every node and the driver need the same token: RAY_AUTH_MODE=token, and the token in "
             "RAY_AUTH_TOKEN or a file (~/.ray/auth_token, or the one RAY_AUTH_TOKEN_PATH names); "
             "`ray get-auth-token --generate` makes one (docs/cluster.md, 'Setting up a cluster')")
NODES_EVERY_S = 5.0
RESOURCES_EVERY_S = 2.0

logger = logging.getLogger(__name__)


@dataclass
class ClusterEval:
    """An eval on a Ray cluster: the attempts, where their logs and runs go, and how to retry.

    `address`: Ray's address (`ray://…`, `host:port`, `auto`) or `local` (a one-machine cluster started
    here). `max_in_flight`: attempts handed to Ray at once (None: all; the rest stay queued here).
    `resources` and `runner` replace what an attempt asks for and does (the scheduler's tests and the
    overhead benchmark); `fresh_worker` gives each try a new worker process (Inspect's process-wide state,
    the model gateway, a GPU's memory: nothing of one attempt is left for the next)."""

    address: str
    specs: list[AttemptSpec]
    log_dir: Path
    runs_dir: Path
    retry_attempts: int = 0
    resume: bool = False
    max_in_flight: int | None = None
    display: str | None = None
    resources: Callable[[AttemptSpec], Resources] | None = None
    runner: Callable[[str, str, dict[str, Any]], dict[str, Any]] = run_attempt
    fresh_worker: bool = True
    prepare: bool = True
    poll_s: float = 0.5


@dataclass
class _InFlight:
    attempt: str
    n: int
    dir: Path
    started: bool = False


@dataclass
class Outcome:
    """What the eval left: the queue (attempts and tries, to read), and whether it was interrupted."""

    queue: AttemptQueue
    interrupted: bool = False
    prepared: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def connect(address: str) -> None:
    """Join the cluster at `address` (or start a local one), once per process."""
    try:
        import ray
    except ImportError:
        raise OpenRebenchError("--cluster needs Ray: pip install 'openrebench[ray]'") from None
    if ray.is_initialized():
        return
    env_vars = forwarded_env(os.environ)
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING,
                               "namespace": "openrebench",
                               "runtime_env": {"env_vars": env_vars} if env_vars else None}
    try:
        if address == "local":
            ray.init(include_dashboard=False, **options)
        else:
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
        if (why := _auth_refused(e)) is not None:
            raise OpenRebenchError(f"--cluster {address}: {why}: {AUTH_HELP}") from None
        raise OpenRebenchError(f"--cluster {address}: {one_line(str(e))}") from None


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The provider keys and endpoints an attempt gets from the driver; never a variable of Ray's (its auth
    token above all: a job's runtime_env is readable by whoever can list the cluster's jobs, and a worker
    authenticates with its own node's token, which it inherits from the node's raylet)."""
    return {k: v for k, v in environ.items() if FORWARDED.search(k) and not k.startswith("RAY_")}


def _auth_refused(error: BaseException) -> str | None:
    """What was wrong with this driver's token, if the cluster's token authentication is why `ray.init`
    failed (else None)."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    if not AUTH_REFUSED.search(text):
        return None
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return "the cluster wants Ray's auth token and this driver sends none (RAY_AUTH_MODE is not token)"
    if "RAY_AUTH_TOKEN_PATH is set but" in text:
        return f"RAY_AUTH_TOKEN_PATH names {os.environ.get('RAY_AUTH_TOKEN_PATH')}, not a readable token file"
    if "no authentication token was found" in text:
        return "RAY_AUTH_MODE=token but this driver has no token"
    return "the cluster refused this driver's Ray auth token (not the one its nodes have)"


@contextlib.contextmanager
def driver_lock(log_dir: Path) -> Iterator[None]:
    """One driver per queue: a second one over the same log directory is refused."""
    log_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OpenRebenchError(f"another driver is running the queue in {log_dir}") from None
        yield
    finally:
        os.close(fd)


class Driver:
    """Runs a `ClusterEval` to its end (every attempt done or failed) or until interrupted."""

    def __init__(self, plan: ClusterEval) -> None:
        self.plan = plan
        self.log_dir = plan.log_dir.expanduser().absolute()
        self.runs_dir = plan.runs_dir.expanduser().absolute()
        self.queue = AttemptQueue(self.log_dir / QUEUE_FILE)
        self.outcome = Outcome(self.queue)
        self._resources = plan.resources
        self._shapes: dict[tuple[str, str], Resources] = {}
        self._in_flight: dict[Any, _InFlight] = {}
        self._prep: dict[Any, tuple[str, str, str]] = {}
        self._prepared: set[tuple[str, str, str]] = set()
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = self._resources_at = 0.0
        self._free: dict[str, float] = {}
        self._total: dict[str, float] = {}

    def resources(self, spec: AttemptSpec) -> Resources:
        if self._resources is not None:
            return self._resources(spec)
        key = (spec.env_id, spec.tier)
        if key not in self._shapes:
            self._shapes[key] = attempt_resources(*key)
        return self._shapes[key]

    # -- the run -----------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        import ray

        connect(self.plan.address)  # first: a driver refused (its token, say) leaves no queue to --resume
        self.queue.plan(self.plan.specs, self.plan.resume)
        self._recover()
        options = {"max_retries": 0, "retry_exceptions": False}
        self._remote = ray.remote(max_calls=1 if self.plan.fresh_worker else 0, **options)(self.plan.runner)
        self._prepare_remote = ray.remote(num_cpus=1, **options)(prepare_assets)
        self._refresh_nodes(force=True)
        self._check_fits()
        progress = Progress(self.plan.display, self.queue, self._cluster_line)
        try:
            with progress:
                while self._turn():
                    progress.update()
                progress.update()
        except KeyboardInterrupt:
            self._stop("the eval was interrupted (Ctrl-C)")
            self.outcome.interrupted = True
        return self.outcome

    def _turn(self) -> bool:
        """One turn of the loop: nodes, submissions, results, starts; False once nothing is left."""
        import ray

        self._refresh_nodes()
        if self.plan.prepare:
            self._prepare_nodes()
        with self.queue.batch():
            self._submit()
        if not self._in_flight:
            return bool(self.queue.attempts("queued"))
        refs = list(self._in_flight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=self.plan.poll_s)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        with self.queue.batch():
            for ref in ready:
                self._collect(ref)
            self._watch_starts()
        self._collect_preparations()
        return True

    def _submit(self) -> None:
        limit = self.plan.max_in_flight
        room = None if limit is None else limit - len(self._in_flight)
        if room is not None and room <= 0:
            return
        for attempt in self.queue.attempts("queued")[:room]:
            spec = attempt.spec
            n = attempt.tries + 1
            folder = self.runs_dir / attempt.id / f"try{n}"
            folder.mkdir(parents=True, exist_ok=True)
            self.queue.submitted(attempt.id, folder)
            meta = {"attempt": attempt.id, "try": n, "epoch": spec.epoch}
            ref = self._remote.options(name=attempt.id, **self.resources(spec).ray_options()).remote(
                spec.to_json(), str(folder), meta)
            self._in_flight[ref] = _InFlight(attempt.id, n, folder)

    def _collect(self, ref: Any) -> None:
        import ray

        item = self._in_flight.pop(ref)
        try:
            result = ray.get(ref)
        except LOST_ERRORS() as e:
            self._lose(item, one_line(str(e)))
            return
        except ray.exceptions.RayTaskError as e:  # the harness failed on the node: the attempt's failure
            cause = e.cause if getattr(e, "cause", None) is not None else e
            self._fail(item, one_line(f"{type(cause).__name__}: {cause}"), None)
            return
        except ray.exceptions.RayError as e:  # Ray could not run it (its runtime environment, say)
            self._fail(item, one_line(str(e)), None)
            return
        self._record(item.attempt, item.n, item.dir, result)

    def _record(self, attempt_id: str, n: int, folder: Path, result: dict[str, Any]) -> None:
        """A try's result, from the task or from its folder (a restarted driver adopting it)."""
        if result.get("started"):  # its start, where the driver did not see the marker in time
            self.queue.started(attempt_id, n, float(result["started"]), str(result.get("node")),
                               list(result.get("gpus") or []))
        if result.get("status") == "done":
            result = {**result, "log": self._publish(result.get("log"))}
            self.queue.finished(attempt_id, n, result)
            return
        item = _InFlight(attempt_id, n, folder)
        self._fail(item, str(result.get("reason") or "failed"), result)

    def _fail(self, item: _InFlight, reason: str, result: dict[str, Any] | None) -> None:
        attempt = self.queue.get(item.attempt)
        final = attempt.failures + 1 > self.plan.retry_attempts
        if final and result is not None:  # the last try's log shows the failure in the log directory
            result = {**result, "log": self._publish(result.get("log"))}
        self.queue.failed(item.attempt, item.n, reason, self.plan.retry_attempts, result)

    def _lose(self, item: _InFlight, reason: str) -> None:
        again = self.queue.lost(item.attempt, item.n, reason)
        _write_line(item.dir / LOST_FILE, {"reason": reason, "time": time.time(), "retried": again,
                                           "start": read_line(item.dir / START_FILE)})

    def _publish(self, log: str | None) -> str | None:
        """Move a try's log into the log directory (where `analyze` and `inspect view` read it)."""
        if not log:
            return None
        source = Path(log.removeprefix("file://"))
        target = self.log_dir / source.name
        if source.exists():
            shutil.move(source, target)
        return str(target) if target.exists() else None

    def _watch_starts(self) -> None:
        for item in self._in_flight.values():
            if not item.started and (start := read_line(item.dir / START_FILE)) is not None:
                item.started = True
                self.queue.started(item.attempt, item.n, float(start["started"]), str(start["node"]),
                                   list(start.get("gpus") or []))

    def _recover(self) -> None:
        """Tries the last driver left open: a result in the try's folder is adopted (the try ended while
        no driver watched); the others are marked and queued again (Ray ended them with their driver)."""
        open_tries = self.queue.recover(self.plan.retry_attempts)
        with self.queue.batch():
            for t in open_tries:
                folder = Path(t.dir)
                if (result := read_line(folder / RESULT_FILE)) is not None:
                    self._record(t.attempt, t.n, folder, result)
                    continue
                reason = "the driver stopped while this try ran"
                _write_line(folder / LOST_FILE, {"reason": reason, "time": time.time(), "retried": True,
                                                 "start": read_line(folder / START_FILE)})
                self.queue.interrupted(t.attempt, t.n, reason)

    def _stop(self, reason: str) -> None:
        """Cancel what runs and leave it queued for `--resume`, its partial runs marked."""
        import ray

        with self.queue.batch():
            for ref, item in list(self._in_flight.items()):
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
                _write_line(item.dir / LOST_FILE, {"reason": reason, "time": time.time(), "retried": True,
                                                   "start": read_line(item.dir / START_FILE)})
                self.queue.interrupted(item.attempt, item.n, reason)
            self._in_flight.clear()

    # -- nodes ---------------------------------------------------------------------------------------------
    def _refresh_nodes(self, force: bool = False) -> None:
        import ray

        now = time.monotonic()
        if force or now - self._nodes_at > NODES_EVERY_S:
            self._nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._nodes_at = now
        if force or now - self._resources_at > RESOURCES_EVERY_S:
            self._free, self._total = ray.available_resources(), ray.cluster_resources()
            self._resources_at = now

    def _check_fits(self) -> None:
        """An attempt no node can ever hold would wait forever: an error on a local cluster, a warning on
        one that may grow (an autoscaler adds nodes as Ray asks)."""
        for spec in {(s.env_id, s.tier): s for s in self.plan.specs}.values():
            need = self.resources(spec)
            if any(need.fits(n["Resources"]) for n in self._nodes):
                continue
            sizes = sorted({Resources(n["Resources"].get("CPU", 0), int(n["Resources"].get("GPU", 0)),
                                      int(n["Resources"].get("memory", 0))).describe() for n in self._nodes})
            message = (f"{spec.env_id} ({spec.tier}) needs {need.describe()} on one node; the cluster's "
                       f"nodes have {'; '.join(sizes) or 'nothing'}")
            if self.plan.address == "local":
                raise OpenRebenchError(message)
            Console(stderr=True).print(f"[yellow]warning:[/] {message}: its attempts wait until such a node "
                                       "joins", highlight=False, soft_wrap=True)

    def _prepare_nodes(self) -> None:
        """Build each environment's assets once on each node that can run it, before its attempts start
        there (an attempt arriving first waits on the node's lock rather than building again)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        pairs = {(s.env_id, s.tier): s for s in self.plan.specs}
        for node in self._nodes:
            for (env_id, tier), spec in pairs.items():
                key = (node["NodeID"], env_id, tier)
                if key in self._prepared or not self.resources(spec).fits(node["Resources"]):
                    continue
                self._prepared.add(key)
                strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ref = self._prepare_remote.options(name=f"prepare {env_id} {tier}",
                                                   scheduling_strategy=strategy).remote(env_id, tier)
                self._prep[ref] = key

    def _collect_preparations(self) -> None:
        import ray

        if not self._prep:
            return
        ready, _ = ray.wait(list(self._prep), num_returns=len(self._prep), timeout=0)
        for ref in ready:
            node, env_id, tier = self._prep.pop(ref)
            try:
                self.outcome.prepared.append(ray.get(ref))
            except ray.exceptions.RayError as e:  # its attempts build the assets themselves
                self.outcome.warnings.append(f"preparing {env_id} ({tier}) on node {node[:8]}: "
                                             f"{one_line(str(e))}")

    def _cluster_line(self) -> str:
        def part(name: str, label: str, scale: float = 1.0, unit: str = "") -> str:
            total = self._total.get(name, 0.0) / scale
            return f"{label} {self._free.get(name, 0.0) / scale:.0f}{unit}/{total:.0f}{unit} free"

        return (f"cluster: {len(self._nodes)} node(s); {part('GPU', 'GPUs')}, {part('CPU', 'CPUs')}, "
                f"{part('memory', 'memory', 1024**3, ' GiB')}")


def LOST_ERRORS() -> tuple[type[BaseException], ...]:
    """Ray's errors for a try that died with its node or worker (not of its own doing): tried again."""
    from ray import exceptions as x

    names = ("NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError", "ObjectLostError",
             "OwnerDiedError", "ActorDiedError")
    return tuple(getattr(x, n) for n in names if hasattr(x, n))
