"""Scoring a run: snapshot the workspace, run the scorer in a separate, limited process, log the row."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import psutil

from ._bwrap import SANDBOX_UID, Bind, Limits, SandboxSpec, bwrap_command, bwrap_usable, sandbox_path
from ._calibration import CalibrationRecord, ProgressFn, calibrate
from ._cgroup import Cgroup
from ._environment import ScoreResult
from ._errors import OpenRebenchError
from ._gpus import all_gpu_nodes
from ._isolation import pid_namespace_prefix
from ._normalise import normalise
from ._run import Run
from ._score_log import ScoreRow, append_row

MAX_SNAPSHOT_BYTES = 4 * 1024**3
RESULT_TAG = "OPENREBENCH-RESULT"


def snapshot_workspace(workspace: Path, dest: Path) -> tuple[str, list[str]]:
    """Copy regular files and folders of `workspace` into `dest`; skip links (they could point into
    protected data). Returns a sha256 over paths and contents, and notes on what was skipped."""
    digest = hashlib.sha256()
    notes: list[str] = []
    total = 0
    dest.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(workspace):
        rel_root = Path(root).relative_to(workspace)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for d in list(dirs):
            if (Path(root) / d).is_symlink():
                notes.append(f"skipped link {rel_root / d}")
                dirs.remove(d)
            else:
                (dest / rel_root / d).mkdir(exist_ok=True)
        for name in sorted(files):
            src = Path(root) / name
            rel = rel_root / name
            if src.is_symlink() or not src.is_file():
                notes.append(f"skipped {'link' if src.is_symlink() else 'special file'} {rel}")
                continue
            total += src.stat().st_size
            if total > MAX_SNAPSHOT_BYTES:
                raise OpenRebenchError(f"workspace is over the {MAX_SNAPSHOT_BYTES >> 30} GiB snapshot limit")
            shutil.copyfile(src, dest / rel)
            digest.update(str(rel).encode() + b"\0")
            with open(dest / rel, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest(), notes


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


RUN_CGROUP_ENV = "OPENREBENCH_RUN_CGROUP"


def _sandboxed_command(solution: Path, protected: Path, devices: Sequence[str], cgroup: Cgroup | None,
                       run_group: Cgroup | None = None) -> tuple[list[str], dict[str, str]]:
    """The scorer inside a fresh bubblewrap sandbox: the snapshot and `protected/` (read-only) are
    all it sees of the run. As root, the scorer keeps root (it must read `protected/`, which is
    root-only) and starts the solution's code as an unprivileged uid that can read neither.
    `run_group`, a sub-group of the scoring's cgroup, is bound in (its files writable by root only) and
    named in $OPENREBENCH_RUN_CGROUP: the scorer puts the solution's timed work there, and counts it
    until the kernel says the group is empty."""
    privileged = os.geteuid() == 0
    if privileged:
        for root, dirs, files in os.walk(solution):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, SANDBOX_UID, SANDBOX_UID)
        protected.chmod(0o700)
    env = {"PATH": sandbox_path(), "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton"}
    if privileged:
        env["OPENREBENCH_SOLUTION_DROP"] = "1"
    group_binds = [Bind(d, f"{SCORE_DIR}/cgroup/{i}", writable=True)
                   for i, d in enumerate(run_group.dirs if run_group else [])]
    if group_binds:
        env[RUN_CGROUP_ENV] = ":".join(b.dest for b in group_binds)
    spec = SandboxSpec(
        binds=[Bind(solution, f"{SCORE_DIR}/solution", writable=True),
               Bind(protected, f"{SCORE_DIR}/protected"), *group_binds],
        cwd=f"{SCORE_DIR}/solution", env=env, devices=devices, drop_privileges=False,
        limits=Limits(max_processes=None if cgroup else 4096))
    # -P: the working directory (the solution) must not come first on sys.path, or a solution
    # shipping openrebench/ or torch/ would replace the scorer's own modules.
    cmd = bwrap_command([sys.executable, "-P", "-m", "openrebench.core._scorer_main"], spec)
    paths = {"solution": f"{SCORE_DIR}/solution", "protected": f"{SCORE_DIR}/protected"}
    return [*(cgroup.enter_prefix() if cgroup else []), *cmd], paths


def run_scorer(env_id: str, tier: str, solution: Path, protected: Path, *, timeout_s: float,
               memory_limit_gb: float, sandboxed: bool = False, devices: Sequence[str] = ()) -> ScoreResult:
    """Run the environment's scorer in a fresh process with a wall-clock and a resident-memory limit:
    in a bubblewrap sandbox with `sandboxed`, else in its own PID namespace where one can be made.
    Any failure becomes an invalid result."""
    nonce = secrets.token_hex(16)
    limit = memory_limit_gb * 1024**3
    cgroup = None
    if sandboxed:
        cgroup = Cgroup.create("score", memory_bytes=int(limit * 1.25) + (1 << 30), max_pids=4096)
        run_group = None
        if cgroup is not None:
            with contextlib.suppress(OSError):
                run_group = cgroup.child("run")
        cmd, paths = _sandboxed_command(solution, protected, devices, cgroup, run_group)
    else:
        cmd = [*pid_namespace_prefix(), sys.executable, "-P", "-m", "openrebench.core._scorer_main"]
        paths = {"solution": str(solution), "protected": str(protected)}
    config = {"env_id": env_id, "tier": tier, "nonce": nonce, **paths}
    try:
        return _watch(cmd, config, solution, nonce, limit, memory_limit_gb, timeout_s, cgroup)
    finally:
        if cgroup is not None:
            cgroup.close()


def _watch(cmd: list[str], config: dict[str, str], cwd: Path, nonce: str, limit: float,
           memory_limit_gb: float, timeout_s: float, cgroup: Cgroup | None) -> ScoreResult:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                start_new_session=True, cwd=cwd)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
        peak = 0
        reason = None
        deadline = time.monotonic() + timeout_s
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, _tree_rss(ps))
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
            return result
    code = proc.returncode
    what = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    if cgroup is not None and code in (-9, 137) and peak > 0.8 * limit:
        what += " (out of memory)"
    return ScoreResult.invalid(
        f"Invalid: the scorer process {what} before reporting a result (did the solution kill it?).",
        **details, scorer_stderr=stderr)


def scoring_sandbox_default() -> bool:
    """Score in a bubblewrap sandbox wherever one starts, unless OPENREBENCH_SCORE_SANDBOX=0."""
    return os.environ.get("OPENREBENCH_SCORE_SANDBOX", "1") != "0" and bwrap_usable() is None


def score_run(run: Run, *, kind: Literal["setup", "score", "calibration"] = "score",
              charged: bool = True, timeout_s: float | None = None, elapsed_s: float | None = None,
              sandboxed: bool | None = None, devices: Sequence[str] | None = None) -> ScoreRow:
    """Score the run's current workspace and append the row to its score log.

    `timeout_s` overrides the tier's scoring time limit (tests use it to stop hanging solutions fast);
    `elapsed_s` is the working time to log (the harness's clock; default: wall-clock since the start);
    `sandboxed` defaults to `scoring_sandbox_default()`; `devices` are the GPU nodes the scorer may
    use (default: all of them, for tiers that need a GPU).
    """
    from openrebench.environments import get_environment

    env = get_environment(run.info.env_id)
    tier = env.tier(run.info.tier)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="openrebench-snapshot-") as tmp:
        snapshot = Path(tmp) / "solution"
        try:
            sha, notes = snapshot_workspace(run.workspace, snapshot)
        except OpenRebenchError as e:
            sha, notes = "", []
            result = ScoreResult.invalid(f"Invalid: {e}.")
        else:
            if sandboxed is None:
                sandboxed = scoring_sandbox_default()
            if devices is None:
                devices = all_gpu_nodes() if tier.device == "cuda" else []
            result = run_scorer(env.id, tier.name, snapshot, run.protected,
                                timeout_s=timeout_s or tier.score_timeout_s,
                                memory_limit_gb=tier.memory_limit_gb, sandboxed=sandboxed, devices=devices)
    if notes:
        result.details["snapshot_notes"] = notes
    result.details["normalisation"] = run.info.constants.model_dump()
    row = ScoreRow(
        index=0, timestamp=datetime.now(UTC),
        elapsed_s=run.elapsed_s() if elapsed_s is None else elapsed_s, kind=kind, charged=charged,
        raw=result.raw, normalised=normalise(result.raw, run.info.constants), message=result.message,
        details=result.details, solution_sha256=sha, duration_s=time.monotonic() - started,
    )
    return append_row(run.score_log_path, row)




def start_run(env_id: str, tier: str, path: Path, *, seed: int | None = None, score_start: bool = True,
              sandboxed: bool | None = None,
              devices: Sequence[str] | None = None) -> tuple[Run, ScoreRow | None]:
    """Set up a run: layout, assets, workspace, and the uncharged scoring of the starting solution
    (skipped with `score_start=False`, for calibration and tests)."""
    from openrebench.environments import get_environment

    from ._paths import cache_dir

    env = get_environment(env_id)
    run = Run.create(env, tier, path, seed=seed)
    env.build_assets(tier, cache_dir())
    env.setup_run(tier, run.workspace, run.protected, cache_dir())
    row = score_run(run, kind="setup", charged=False, sandboxed=sandboxed, devices=devices) \
        if score_start else None
    run.mark_started()
    return run, row


def calibrate_environment(env_id: str, tier: str, repeats: int, *, command: str,
                          on_progress: ProgressFn | None = None) -> CalibrationRecord:
    """Score the starting and the reference solutions `repeats` times each, in throw-away runs."""
    from openrebench.environments import get_environment

    env = get_environment(env_id)
    env.tier(tier)
    with tempfile.TemporaryDirectory(prefix="openrebench-calibrate-") as tmp:
        runs: dict[str, Run] = {}

        def score_once(which: str) -> tuple[float | None, str]:
            if which not in runs:
                run, _ = start_run(env_id, tier, Path(tmp) / which, score_start=False)
                (env.install_reference if which == "reference" else env.install_starting)(run.workspace, tier)
                runs[which] = run
            row = score_run(runs[which], kind="calibration", charged=False)
            return row.raw, row.message

        return calibrate(env, tier, repeats, score_once=score_once, command=command, on_progress=on_progress)
