"""The scorer's process: started in a fresh bubblewrap sandbox (or its own PID namespace), fed its
configuration, watched against its wall-clock and memory limits, and read for its one result line."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from openrebench.api import (
    RUN_CGROUP_ENV,
    SOLUTION_UID_ENV,
    SOLUTION_USER,
    Environment,
    ScoreResult,
)
from openrebench.isolation import (
    Bind,
    Cgroup,
    ProcessLimits,
    SandboxSpec,
    _janitor,
    allocate_uid,
    bwrap_command,
    bwrap_usable,
    identity_files,
    pid_namespace_prefix,
    plugin_folders,
    sandbox_path,
)

from ._registry import class_path, get_environment
from ._run import Run

RESULT_TAG = "OPENREBENCH-RESULT"
READY_TAG = "OPENREBENCH-READY"  # the scorer started: what fails later is the scoring's, not the set-up's

def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for p in [proc, *children]:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


SCORE_DIR = "/score"


@dataclass(frozen=True)
class ScoringAccess:
    """What a scorer is given beyond the snapshot and the protected folder (the run's models, through
    the harness's gateway): folders bound into its sandbox, environment variables, a command its process
    is started through (inside the sandbox, so it shares the scorer's network namespace), and `report`,
    called once the scorer has ended, whose entries go into the row's details. Whoever makes it knows
    whether the scoring is sandboxed (binds and paths differ), hence `ScoringAccessFn`."""

    binds: tuple[Bind, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()
    report: Callable[[], Mapping[str, Any]] | None = None
    models: Mapping[str, str] = field(default_factory=dict)  # role: model spec, as granted
    infrastructure: Callable[[], str | None] | None = None
    """Called once the scorer has ended: what failed on the harness's side meanwhile (the model's
    backend down, the gateway gone), in words, or None. A scoring it names is an infrastructure
    failure whatever the scorer made of it: a score measured while the models failed measures them."""


class ScoringAccessFn(Protocol):
    """(run, sandboxed) -> a context holding the access for one scoring (granted on entry, revoked on
    exit); with `build`, for an asset build of the run's set-up instead (unsandboxed, once per set of
    models and cached, so on no scoring's budget)."""

    def __call__(self, run: Run, sandboxed: bool, /, *,
                 build: bool = False) -> AbstractContextManager[ScoringAccess | None]: ...



def _sandboxed_command(solution: Path, protected: Path, devices: Sequence[str], cgroup: Cgroup | None,
                       run_group: Cgroup | None = None, access: ScoringAccess | None = None,
                       tools: Sequence[str] = (), triton_cache: Path | None = None
                       ) -> tuple[list[str], dict[str, str]]:
    """The scorer inside a fresh bubblewrap sandbox: the snapshot and `protected/` (read-only) are
    all it sees of the run. As root, the scorer keeps root (it must read `protected/`, which is
    root-only) and starts the solution's code as an unprivileged uid that can read neither.
    `run_group`, a sub-group of the scoring's cgroup, is bound in (its files writable by root only) and
    named in $OPENREBENCH_RUN_CGROUP: the scorer puts the solution's timed work there, and counts it
    until the kernel says the group is empty. `triton_cache`, the run's kept Triton cache (see
    `_kept_triton_cache`), is bound in as Triton's cache instead of a fresh one in /tmp."""
    privileged = os.geteuid() == 0
    identity: list[Bind] = []
    env = {"PATH": sandbox_path(), "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton"}
    if privileged:
        # The solution's code runs as a uid of this scoring's own, never used before or after: nothing it
        # leaves in what the kernel keys by uid can belong to the agent or another run.
        uid = allocate_uid("scoring")
        for root, dirs, files in os.walk(solution):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, uid, uid)
        protected.chmod(0o700)
        passwd, group = identity_files(solution.parent / "etc", uid, SOLUTION_USER, "/tmp")
        identity = [Bind(passwd, "/etc/passwd"), Bind(group, "/etc/group")]
        env[SOLUTION_UID_ENV] = str(uid)
    group_binds = [Bind(d, f"{SCORE_DIR}/cgroup/{i}", writable=True)
                   for i, d in enumerate(run_group.dirs if run_group else [])]
    if group_binds:
        env[RUN_CGROUP_ENV] = ":".join(b.dest for b in group_binds)
    cache_binds = []
    if triton_cache is not None:
        # Existing entries stay the harness's (read-only to the solution); new kernels go in new folders.
        triton_cache.chmod(0o1777)
        cache_binds = [Bind(triton_cache, f"{SCORE_DIR}/triton-cache", writable=True)]
        env["TRITON_CACHE_DIR"] = f"{SCORE_DIR}/triton-cache"
    access = access or ScoringAccess()
    env = {**access.env, **env}  # the access adds variables, never replaces the scorer's own
    spec = SandboxSpec(
        binds=[Bind(solution, f"{SCORE_DIR}/solution", writable=True),
               Bind(protected, f"{SCORE_DIR}/protected"), *identity, *group_binds, *cache_binds,
               *access.binds],
        cwd=f"{SCORE_DIR}/solution", env=env, devices=devices, drop_privileges=False, plugins=True,
        limits=ProcessLimits(max_processes=None if cgroup else 4096), tools=tools)
    # -P: the working directory (the solution) must not come first on sys.path, or a solution
    # shipping openrebench/ or torch/ would replace the scorer's own modules.
    cmd = bwrap_command([*access.prefix, sys.executable, "-P", "-m", "openrebench.runs._scorer_main"], spec)
    paths = {"solution": f"{SCORE_DIR}/solution", "protected": f"{SCORE_DIR}/protected"}
    return [*(cgroup.enter_prefix() if cgroup else []), *cmd], paths


def score_solution(env: str | Environment, tier: str, solution: Path, protected: Path, *, timeout_s: float,
               memory_limit_gb: float, sandboxed: bool = False, devices: Sequence[str] = (),
               access: ScoringAccess | None = None, stop: threading.Event | None = None,
               triton_cache: Path | None = None) -> ScoreResult:
    """Run the environment's scorer in a fresh process with a wall-clock and a resident-memory limit:
    in a bubblewrap sandbox with `sandboxed` (with `triton_cache` as Triton's cache), else in its own PID
    namespace where one can be made, with what `access` adds. Any failure becomes an invalid result.

    `env` is the environment, or its id: a scoring passes the one its run carries, so the registry is
    asked only for an id."""
    if isinstance(env, str):
        env = get_environment(env)
    nonce = secrets.token_hex(16)
    limit = memory_limit_gb * 1024**3
    cgroup = None
    began = time.time()
    if sandboxed:
        cgroup = Cgroup.create("score", memory_bytes=int(limit * 1.25) + (1 << 30), max_pids=4096)
        run_group = None
        if cgroup is not None:
            for d in cgroup.dirs:
                _janitor.track("cgroup", d)
            with contextlib.suppress(OSError):
                run_group = cgroup.child("run")
        tools = [str(t) for t in env.host_tools(tier)]
        cmd, paths = _sandboxed_command(solution, protected, devices, cgroup, run_group, access, tools,
                                        triton_cache)
        variables = None
    else:
        prefix = access.prefix if access else ()
        cmd = [*pid_namespace_prefix(), *prefix, sys.executable, "-P", "-m", "openrebench.runs._scorer_main"]
        paths = {"solution": str(solution), "protected": str(protected)}
        variables = _scorer_env()
        if access and access.env:
            variables = {**(variables or os.environ), **access.env}
    config: dict[str, Any] = {"env_id": env.id, "env_class": class_path(env), "tier": tier, "nonce": nonce,
                              **paths}
    try:
        result = _watch(cmd, config, solution, nonce, limit, memory_limit_gb, timeout_s, cgroup,
                        env=variables, stop=stop)
        phases = result.details.get("harness_phases_s")
        if isinstance(phases, dict) and isinstance(config.get("launched_at"), float):
            phases["sandbox_setup"] = round(config["launched_at"] - began, 3)
        return result
    finally:
        if cgroup is not None:
            cgroup.close()
            for d in cgroup.dirs:
                _janitor.untrack("cgroup", d)


def _scorer_env() -> dict[str, str] | None:
    """The unsandboxed scorer's environment: this process's, with the folders of the plug-ins it found
    on PYTHONPATH, so that the scorer knows the same environments even where they were put on this
    process's import path at run time. None (inherit) where nothing is missing."""
    current = os.environ.get("PYTHONPATH", "")
    missing = [f for f in plugin_folders() if f not in current.split(os.pathsep)]
    if not missing:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*missing, *filter(None, [current])])}


def _watch(cmd: list[str], config: dict[str, str], cwd: Path, nonce: str, limit: float,
           memory_limit_gb: float, timeout_s: float, cgroup: Cgroup | None,
           env: dict[str, str] | None = None, stop: threading.Event | None = None) -> ScoreResult:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        config["launched_at"] = time.time()  # the scorer's own phases are counted from here
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                start_new_session=True, cwd=cwd, env=env)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
        peak = 0
        reason = None
        deadline = time.monotonic() + timeout_s
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, _tree_rss(ps))
            if stop is not None and stop.is_set():  # the attempt ended (Ctrl-C, its end): none to score for
                _kill_tree(proc)
                if cgroup is not None:
                    cgroup.kill_all()
                proc.wait()
                return infrastructure_failure("the attempt ended while this scoring ran", peak_rss_bytes=peak)
            if peak > limit:
                reason = f"used more than {memory_limit_gb:g} GB of memory"
            elif time.monotonic() > deadline:
                reason = f"took longer than the {timeout_s:g} s scoring limit"
            if reason:
                _kill_tree(proc)
                if cgroup is not None:
                    cgroup.kill_all()
                proc.wait()
                return ScoreResult.invalid(f"Invalid: the solution {reason}; scoring was stopped.",
                                           peak_rss_bytes=peak)
            time.sleep(0.05)
        _kill_tree(proc)  # anything it left behind
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")[-4000:]
    details: dict[str, object] = {"peak_rss_bytes": peak, "scorer_exit_code": proc.returncode,
                                  "sandboxed": cgroup is not None or "bwrap" in " ".join(cmd[:8])}
    for line in stdout.splitlines():
        if line.startswith(f"{RESULT_TAG} {nonce} ") and proc.returncode == 0:
            try:
                result = ScoreResult.model_validate_json(line.split(" ", 2)[2])
            except ValueError:
                break
            result.details.update(details)
            phases = result.details.get("harness_phases_s")
            if isinstance(phases, dict):  # the scorer's own phases, and its exit after the result
                ended = time.time() - config["launched_at"]
                inside = sum(v for v in phases.values() if isinstance(v, int | float))
                phases["scorer_exit"] = round(max(ended - inside, 0.0), 3)
            return result
    code = proc.returncode
    what = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    if f"{READY_TAG} {nonce}" not in stdout.splitlines():
        # It never reached the solution: bubblewrap, Python or the package could not start it.
        return infrastructure_failure(f"the scorer process {what} before it started: {_first_line(stderr)}",
                                      **details, scorer_stderr=stderr)
    if cgroup is not None and code in (-9, 137) and peak > 0.8 * limit:
        what += " (out of memory)"
    return ScoreResult.invalid(
        f"Invalid: the scorer process {what} while scoring this solution, before reporting a result (the "
        "solution's code crashed or ended it, or memory ran out); the details are in the run's score log.",
        **details, scorer_stderr=stderr)


def _first_line(text: str, limit: int = 200) -> str:
    """The first informative line of a failure's output, for a one-line message."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    useful = [x for x in lines if not x.startswith(("Traceback", "File ", "  File"))]
    line = useful[-1] if useful and "Error" in useful[-1] else (useful or lines or ["no output"])[0]
    return line if len(line) <= limit else line[:limit - 1] + "…"


def scoring_sandbox_default() -> bool:
    """Score in a bubblewrap sandbox wherever one starts, unless OPENREBENCH_SCORE_SANDBOX=0."""
    return os.environ.get("OPENREBENCH_SCORE_SANDBOX", "1") != "0" and bwrap_usable() is None


def infrastructure_failure(what: str, **details: Any) -> ScoreResult:
    """An invalid result that is the harness's fault, not the solution's, said in one line."""
    return ScoreResult.invalid(f"Invalid: infrastructure failure ({what}), not caused by your solution; "
                               "the details are in the run's score log.",
                               infrastructure=True, **details)

