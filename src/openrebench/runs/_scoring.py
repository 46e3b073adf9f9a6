"""Scoring a run: snapshot the workspace, run the scorer in a separate, limited process, log the row."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from openrebench.api import (
    RUN_CGROUP_ENV,
    SOLUTION_UID_ENV,
    SOLUTION_USER,
    Environment,
    ScoreResult,
)
from openrebench.base import OpenRebenchError
from openrebench.isolation import (
    Bind,
    Cgroup,
    Limits,
    SandboxSpec,
    _janitor,
    all_gpu_nodes,
    allocate_uid,
    bwrap_command,
    bwrap_usable,
    identity_files,
    pid_namespace_prefix,
    plugin_folders,
    sandbox_path,
)

from ._calibration import (
    CalibrationRecord,
    ProgressFn,
    bootstrapping,
    calibrate,
    constants_for,
)
from ._files import default_cache_dir, install_reference, place, set_up_files
from ._normalise import normalise, paper_constants, paper_matched
from ._registry import get_environment
from ._run import Run, check_new_run_dir
from ._score_log import ScoreRow, append_row, bound_row, bound_text

MAX_SNAPSHOT_BYTES = 4 * 1024**3  # the default; a tier may set its own (TierSpec.max_workspace_gb)
MAX_SNAPSHOT_FILES = 200_000
MAX_SNAPSHOT_DEPTH = 64
RESULT_TAG = "OPENREBENCH-RESULT"
READY_TAG = "OPENREBENCH-READY"  # the scorer started: what fails later is the scoring's, not the set-up's
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)


_REPLACED = "replaced while the snapshot was taken"
_SKIPPED = {errno.ELOOP: _REPLACED, errno.ENOTDIR: _REPLACED, errno.EISDIR: _REPLACED, errno.ENXIO: _REPLACED,
            errno.EACCES: "not readable", errno.EPERM: "not readable"}


_read = os.read  # how the snapshot reads the agent's files (tests change a file mid-copy here)
_NOTES = 200  # notes kept on what the snapshot skipped; the rest are counted in one more


def _before_open(rel: str) -> None:
    """Called just before each workspace entry is opened (tests race a swap into that window)."""


def _cost(st: os.stat_result) -> tuple[int, int]:
    """What an entry counts against the limits, (entries, bytes): every entry one, links, FIFOs and sockets
    included though skipped (a million links must not walk for free), each hard link on its own; a regular
    file its apparent size, charged before a byte is read (a sparse 100 GB file is refused unread)."""
    return 1, st.st_size if stat.S_ISREG(st.st_mode) else 0


def _list_names(fd: int, room: int) -> list[str]:
    """The folder's names, sorted, read as a stream and given up past `room` (the entries the limit has
    left): os.listdir would hold a folder of millions of names in memory before any limit is checked."""
    names: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > room:
                raise _too_many()
    names.sort()
    return names


def _too_many() -> OpenRebenchError:
    return OpenRebenchError(f"the workspace holds more than {MAX_SNAPSHOT_FILES:,} files and folders "
                            "(links and other special files count too)")


def _changed(path: str) -> OpenRebenchError:
    return OpenRebenchError(f"{_shown(path)} changed while the snapshot was taken (stop whatever writes to "
                            "it, then score again)")


def _shown(path: str, limit: int = 160) -> str:
    """A path as one printable line of bounded length: names are the agent's bytes (newlines, bytes that
    are not UTF-8 and that JSON cannot write, 255 bytes a level, 64 levels)."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in path)
    return text if len(text) <= limit else f"{text[:limit // 2 - 1]}…{text[-(limit // 2):]}"


class _Snapshot:
    """The state of one copy: the digest, notes, and the limits' counters."""

    def __init__(self, max_bytes: int = MAX_SNAPSHOT_BYTES) -> None:
        self.digest = hashlib.sha256()
        self.notes: list[str] = []
        self.more_notes = 0
        self.bytes = 0
        self.files = 0
        self.max_bytes = max_bytes

    def note(self, what: str, path: str) -> None:
        if len(self.notes) < _NOTES:
            self.notes.append(what.format(_shown(path)))
        else:
            self.more_notes += 1

    def copy_dir(self, src_fd: int, dst_fd: int, rel: str, depth: int) -> None:
        if depth > MAX_SNAPSHOT_DEPTH:
            raise OpenRebenchError(f"the workspace is nested deeper than {MAX_SNAPSHOT_DEPTH} folders "
                                   f"(at {_shown(rel)})")
        for name in _list_names(src_fd, MAX_SNAPSHOT_FILES - self.files):
            path = f"{rel}{name}"
            try:
                st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
            except FileNotFoundError:
                self.count(1)
                self.note("skipped {} (removed while the snapshot was taken)", path)
                continue
            self.count(_cost(st)[0])
            if stat.S_ISDIR(st.st_mode):
                if name != "__pycache__":
                    self.copy_subdir(src_fd, dst_fd, name, path, depth)
            elif stat.S_ISREG(st.st_mode):
                self.copy_file(src_fd, dst_fd, name, path)
            else:
                self.note(f"skipped {'link' if stat.S_ISLNK(st.st_mode) else 'special file'} {{}}", path)

    def open_entry(self, src_fd: int, name: str, path: str, flags: int) -> int | None:
        """The entry opened relative to its folder, or None (with a note) where it was removed or
        replaced since it was listed (ELOOP: now a link; ENOTDIR, EISDIR: another kind; ENXIO: a socket)."""
        _before_open(path)
        try:
            return os.open(name, flags, dir_fd=src_fd)
        except FileNotFoundError:
            self.note("skipped {} (removed while the snapshot was taken)", path)
        except OSError as e:
            if e.errno not in _SKIPPED:
                raise
            self.note(f"skipped {{}} ({_SKIPPED[e.errno]})", path)
        return None

    def copy_subdir(self, src_fd: int, dst_fd: int, name: str, path: str, depth: int) -> None:
        fd = self.open_entry(src_fd, name, path, _DIR_FLAGS)
        if fd is None:
            return
        try:
            os.mkdir(name, 0o755, dir_fd=dst_fd)
            sub = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
            try:
                self.copy_dir(fd, sub, f"{path}/", depth + 1)
            finally:
                os.close(sub)
        finally:
            os.close(fd)

    def count(self, entries: int) -> None:
        self.files += entries
        if self.files > MAX_SNAPSHOT_FILES:
            raise _too_many()

    def charge(self, total: int) -> None:
        """Checked before the bytes that would cross the limit are written, never after."""
        if total > self.max_bytes:
            raise OpenRebenchError(f"the workspace is over the {self.max_bytes / 1024**3:g} GiB snapshot "
                                   "limit (a file counts at its full size, sparse or not)")

    def copy_file(self, src_fd: int, dst_fd: int, name: str, path: str) -> None:
        fd = self.open_entry(src_fd, name, path, _FILE_FLAGS)
        if fd is None:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a FIFO or device swapped in after the listing
                self.note("skipped {} (replaced while the snapshot was taken)", path)
                return
            base, counted = self.bytes, _cost(st)[1]
            self.charge(base + counted)
            os.set_blocking(fd, True)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                          dir_fd=dst_fd)
            self.digest.update(os.fsencode(path) + b"\0")
            copied = 0
            try:
                while block := _read(fd, 1 << 20):
                    copied += len(block)
                    if copied > st.st_size:  # growing: stop at once, not at the limit
                        raise _changed(path)
                    self.charge(base + max(counted, copied))  # what is read counts, whatever fstat said
                    self.digest.update(block)
                    view = memoryview(block)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(out)
            self.bytes = base + max(counted, copied)
            if copied != st.st_size or os.fstat(fd).st_size != st.st_size:
                raise _changed(path)
        finally:
            os.close(fd)


def snapshot_workspace(workspace: Path, dest: Path, max_bytes: int = MAX_SNAPSHOT_BYTES
                       ) -> tuple[str, list[str]]:
    """Copy the regular files and folders of `workspace` into `dest`; returns a sha256 over paths and
    contents, and notes on what was skipped (at most `_NOTES`, and one line on how many more).

    The walk holds a file descriptor for each folder and opens every entry relative to it without
    following links, and copies only what fstat of the opened descriptor says is a regular file: a
    link, FIFO or device swapped in at any moment is skipped (never followed, never blocks), and a
    folder renamed mid-walk cannot lead outside the workspace. A file that vanishes is skipped with a
    note; one that changes size while copied, or breaking a limit, raises OpenRebenchError, and what was
    copied is removed again (as after any failure).
    """
    snap = _Snapshot(max_bytes)
    try:
        src = os.open(workspace, _DIR_FLAGS)
    except OSError as e:
        raise OpenRebenchError(f"the workspace cannot be opened as a folder ({os.strerror(e.errno or 0)})") \
            from None
    try:
        dest.mkdir(parents=True, exist_ok=True)
        there = set(os.listdir(dest))
        dst = os.open(dest, _DIR_FLAGS)
        try:
            snap.copy_dir(src, dst, "", 0)
        except BaseException:
            _remove_added(dest, there)
            raise
        finally:
            os.close(dst)
    finally:
        os.close(src)
    if snap.more_notes:
        snap.notes.append(f"and {snap.more_notes:,} more skipped")
    return snap.digest.hexdigest(), snap.notes


def _remove_added(dest: Path, there: set[str]) -> None:
    """After a failed copy, what it added to `dest` goes (and `dest` itself, if it was empty): a refused
    snapshot leaves nothing on the disk."""
    if not there:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for name in set(os.listdir(dest)) - there:  # the copy makes only folders and regular files
        with contextlib.suppress(OSError):
            (dest / name).unlink() if (dest / name).is_file() else shutil.rmtree(dest / name)


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
        limits=Limits(max_processes=None if cgroup else 4096), tools=tools)
    # -P: the working directory (the solution) must not come first on sys.path, or a solution
    # shipping openrebench/ or torch/ would replace the scorer's own modules.
    cmd = bwrap_command([*access.prefix, sys.executable, "-P", "-m", "openrebench.runs._scorer_main"], spec)
    paths = {"solution": f"{SCORE_DIR}/solution", "protected": f"{SCORE_DIR}/protected"}
    return [*(cgroup.enter_prefix() if cgroup else []), *cmd], paths


def run_scorer(env_id: str, tier: str, solution: Path, protected: Path, *, timeout_s: float,
               memory_limit_gb: float, sandboxed: bool = False, devices: Sequence[str] = (),
               access: ScoringAccess | None = None, stop: threading.Event | None = None,
               triton_cache: Path | None = None) -> ScoreResult:
    """Run the environment's scorer in a fresh process with a wall-clock and a resident-memory limit:
    in a bubblewrap sandbox with `sandboxed` (with `triton_cache` as Triton's cache), else in its own PID
    namespace where one can be made, with what `access` adds. Any failure becomes an invalid result."""
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
        tools = [str(t) for t in get_environment(env_id).host_tools(tier)]
        cmd, paths = _sandboxed_command(solution, protected, devices, cgroup, run_group, access, tools,
                                        triton_cache)
        env = None
    else:
        prefix = access.prefix if access else ()
        cmd = [*pid_namespace_prefix(), *prefix, sys.executable, "-P", "-m", "openrebench.runs._scorer_main"]
        paths = {"solution": str(solution), "protected": str(protected)}
        env = _scorer_env()
        if access and access.env:
            env = {**(env or os.environ), **access.env}
    config: dict[str, Any] = {"env_id": env_id, "tier": tier, "nonce": nonce, **paths}
    try:
        result = _watch(cmd, config, solution, nonce, limit, memory_limit_gb, timeout_s, cgroup, env=env,
                        stop=stop)
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


PROTECTED_MANIFEST = "protected_manifest.json"


def infrastructure_failure(what: str, **details: Any) -> ScoreResult:
    """An invalid result that is the harness's fault, not the solution's, said in one line."""
    return ScoreResult.invalid(f"Invalid: infrastructure failure ({what}), not caused by your solution; "
                               "the details are in the run's score log.",
                               infrastructure=True, **details)


@contextlib.contextmanager
def _tracked_temp_dir(prefix: str) -> Iterator[str]:
    """A temporary folder that the janitor removes if the harness dies before it does."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        _janitor.track("dir", tmp)
        try:
            yield tmp
        finally:
            _janitor.untrack("dir", tmp)


def _record_protected(run: Run) -> None:
    """Sizes of the protected files at set-up, so that a scoring can tell they are gone or changed."""
    sizes = {str(p.relative_to(run.protected)): p.stat().st_size
             for p in sorted(run.protected.rglob("*")) if p.is_file()}
    (run.path / PROTECTED_MANIFEST).write_text(json.dumps(sizes, indent=1) + "\n")


def _protected_problem(run: Run) -> str | None:
    manifest = run.path / PROTECTED_MANIFEST
    if not manifest.is_file():
        return None if run.protected.is_dir() else "the run's protected folder is missing"
    try:
        sizes = json.loads(manifest.read_text())
        for rel, size in sizes.items():
            if (run.protected / rel).stat().st_size != size:
                return f"the protected file {rel} has changed since set-up"
    except FileNotFoundError as e:
        return f"the protected file {Path(e.filename or '?').name} is missing"
    except (OSError, ValueError, AttributeError) as e:
        return f"the protected files cannot be checked ({type(e).__name__})"
    return None


def _score_snapshot(run: Run, timeout_s: float | None, sandboxed: bool | None,
                    devices: Sequence[str] | None, access: ScoringAccessFn | None = None,
                    stop: threading.Event | None = None) -> tuple[ScoreResult, str, list[str]]:
    env = run.env
    tier = env.tier(run.info.tier)
    with _tracked_temp_dir("openrebench-snapshot-") as tmp:
        snapshot = Path(tmp) / "solution"
        began = time.monotonic()
        try:
            sha, notes = snapshot_workspace(run.workspace, snapshot, int(tier.max_workspace_gb * 1024**3))
        except OpenRebenchError as e:
            return ScoreResult.invalid(f"Invalid: {e}."), "", []
        snapshot_s = round(time.monotonic() - began, 3)
        problem = _protected_problem(run)
        if problem:
            return infrastructure_failure(problem), sha, notes
        if sandboxed is None:
            sandboxed = scoring_sandbox_default()
        if devices is None:
            devices = all_gpu_nodes() if tier.device == "cuda" else []
        cache = Path(tmp) / "triton-cache" if tier.triton_cache and sandboxed else None
        if cache is not None:
            _kept_triton_cache(run, cache, load=True)
        with access(run, sandboxed) if access else nullcontext(None) as given:
            result = run_scorer(env.id, tier.name, snapshot, run.protected,
                                timeout_s=timeout_s or tier.score_timeout_s,
                                memory_limit_gb=tier.memory_limit_gb, sandboxed=sandboxed, devices=devices,
                                access=given, stop=stop, triton_cache=cache)
            if cache is not None:
                result.details["triton_cache"] = _kept_triton_cache(run, cache, load=False)
            phases = result.details.get("harness_phases_s")
            if isinstance(phases, dict):
                result.details["harness_phases_s"] = {"snapshot": snapshot_s, **phases}
            if given is not None and given.report is not None:
                result.details.update(given.report())
            failed = given.infrastructure() if given is not None and given.infrastructure else None
            if failed and not result.details.get("infrastructure"):
                details = {k: v for k, v in result.details.items() if k != "infrastructure"}
                result = infrastructure_failure(failed, **details, scored_as={"raw": result.raw,
                                                                              "message": result.message})
    return result, sha, notes


TRITON_CACHE_BYTES = 256 << 20


def _kept_triton_cache(run: Run, scoring: Path, *, load: bool) -> str:
    """The run's Triton cache (`<run>/scoring-cache/triton`, the harness's, never in the agent's sandbox):
    with `load`, copied into `scoring` (the folder a scoring binds as Triton's cache); else what that
    scoring left there is copied back as the new cache. Both copies are snapshots (regular files and
    folders only, no link followed, at most TRITON_CACHE_BYTES); a cache that breaks a limit is dropped, so
    the next scoring compiles again. Returns what happened, for the row's details."""
    store = run.path / "scoring-cache" / "triton"
    if load:
        scoring.mkdir()
        if store.is_dir():
            try:
                snapshot_workspace(store, scoring, TRITON_CACHE_BYTES)
            except OpenRebenchError:
                shutil.rmtree(scoring, ignore_errors=True)
                scoring.mkdir(exist_ok=True)
        return "loaded"
    fresh = store.with_name(f"triton.{secrets.token_hex(4)}")
    try:
        snapshot_workspace(scoring, fresh, TRITON_CACHE_BYTES)
    except OpenRebenchError as e:
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
        return f"dropped ({e})"
    fresh.parent.chmod(0o700)
    shutil.rmtree(store, ignore_errors=True)
    try:
        fresh.rename(store)
    except OSError:  # another scoring of this run kept its cache first
        shutil.rmtree(fresh, ignore_errors=True)
    return "kept"


def score_run(run: Run, *, kind: Literal["setup", "score", "calibration"] = "score",
              charged: bool = True, timeout_s: float | None = None, elapsed_s: float | None = None,
              sandboxed: bool | None = None, devices: Sequence[str] | None = None,
              access: ScoringAccessFn | None = None, refused: str | None = None,
              stop: threading.Event | None = None) -> ScoreRow:
    """Score the run's current workspace and append the row to its score log: exactly one row, whatever
    the solution or the harness did (a harness exception becomes an infrastructure row, re-raised
    afterwards only if it was an interruption).

    `timeout_s` overrides the tier's scoring time limit (tests use it to stop hanging solutions fast);
    `elapsed_s` is the working time to log (the harness's clock; default: wall-clock since the start);
    `sandboxed` defaults to `scoring_sandbox_default()`; `devices` are the GPU nodes the scorer may
    use (default: all of them, for tiers that need a GPU); `access` what the scorer is given besides
    (the run's models: see `ScoringAccess`); `refused`, why the harness may not score now (the agent
    could not be frozen, say): the row is then an infrastructure failure that says so, and nothing runs;
    `stop`, set by whoever ends the attempt meanwhile: the scorer is killed and the row says why.
    """
    started = time.monotonic()
    sha, notes, interrupted = "", [], None
    try:
        if refused is not None:
            result = infrastructure_failure(f"scoring refused: {refused}")
        else:
            result, sha, notes = _score_snapshot(run, timeout_s, sandboxed, devices, access, stop)
    except BaseException as e:  # the harness's own failure: still one row
        interrupted = None if isinstance(e, Exception) else e
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)  # another run's flood, say
        what = ("scoring was interrupted" if interrupted else "the disk is full" if full
                else "the harness failed while scoring")
        result = infrastructure_failure(what, error=bound_text(f"{type(e).__name__}: {e}"),
                                        traceback=traceback.format_exc()[-4000:])
    try:
        if notes:
            result.details["snapshot_notes"] = notes[:_NOTES + 1]
        result.details["normalisation"] = run.info.constants.model_dump()
        normalised = normalise(result.raw, run.info.constants)
        paper = paper_constants(run.env, run.info.tier)
        if paper is not None:
            result.details["paper_normalisation"] = paper.model_dump()
        elapsed = run.elapsed_s() if elapsed_s is None else elapsed_s
        row = bound_row(ScoreRow(index=0, timestamp=datetime.now(UTC), elapsed_s=elapsed, kind=kind,
                                 charged=charged, raw=result.raw, normalised=normalised,
                                 normalised_paper=paper_matched(result.raw, run.info.constants, paper),
                                 message=result.message, details=result.details,
                                 solution_sha256=sha, duration_s=time.monotonic() - started))
        row.model_dump_json()  # details that cannot be written must not cost the row
    except Exception as e:
        row = ScoreRow(index=0, timestamp=datetime.now(UTC), elapsed_s=elapsed_s or 0.0, kind=kind,
                       charged=charged, raw=None, normalised=None,
                       message=infrastructure_failure("the harness could not record the result").message,
                       details={"infrastructure": True, "error": bound_text(f"{type(e).__name__}: {e}")},
                       solution_sha256=sha, duration_s=time.monotonic() - started)
    row = append_row(run.score_log_path, row)
    if interrupted is not None:
        raise interrupted
    return row


def start_run(env: Environment | str, tier: str, path: Path, *, seed: int | None = None,
              score_start: bool = True, sandboxed: bool | None = None,
              devices: Sequence[str] | None = None, access: ScoringAccessFn | None = None,
              models: Mapping[str, str] | None = None) -> tuple[Run, ScoreRow | None]:
    """Set up a run: layout, assets, workspace, and the uncharged scoring of the starting solution
    (skipped with `score_start=False`, for calibration and tests), given `access` (see `score_run`);
    `models` (role: model) are the run's where they are not the tier's defaults (its constants are
    then those calibrated with them).

    Everything up to the scoring is built in a hidden folder beside `path` and renamed into place
    when complete, so a failed or interrupted set-up leaves no half-made run behind."""
    from openrebench.base import cache_dir

    env = get_environment(env)
    path = Path(path).expanduser().absolute()
    check_new_run_dir(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{path.name}.setting-up-", dir=path.parent))
    partial.chmod(0o755)  # as a plain mkdir would make it; mkdtemp's 0700 would hide the workspace
    from ._self_calibration import calibrate_machine, drifted

    try:
        if score_start:  # an attempt or a person will work on it: the constants must be this machine's
            calibrate_machine(env, tier, models=models, access=access)
        run = Run.create(env, tier, partial, seed=seed, models=models)
        set_up_files(run, env, cache_dir(), access=access)
        _record_protected(run)
        check_new_run_dir(path)
        if path.exists():
            path.rmdir()
        partial.rename(path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    run = Run(path, run.info)
    row = score_run(run, kind="setup", charged=False, sandboxed=sandboxed, devices=devices,
                    access=access) if score_start else None
    if row is not None and drifted(env, tier, row.raw, models) and calibrate_machine(
            env, tier, models=models, access=access, replace=True):
        # This machine no longer scores the start as its record says: measured again, and the start scored
        # again with the new record's constants (the first set-up row stays, with the constants it had).
        run.info.constants = constants_for(env, tier, models=models)
        row = score_run(run, kind="setup", charged=False, sandboxed=sandboxed, devices=devices, access=access)
    run.mark_started()
    return run, row


def calibrate_environment(env: Environment | str, tier: str, repeats: int, *, command: str,
                          on_progress: ProgressFn | None = None, access: ScoringAccessFn | None = None,
                          models: Mapping[str, str] | None = None, probe_repeats: int = 1
                          ) -> CalibrationRecord:
    """Score the starting and the reference solutions `repeats` times each, then each of the
    environment's probes `probe_repeats` times (0: none), in throw-away runs, given `access` (the tier's
    models, for environments that call one while scoring: see `score_run`)."""
    env = get_environment(env)
    env.tier(tier)
    with tempfile.TemporaryDirectory(prefix="openrebench-calibrate-") as tmp, bootstrapping():
        runs: dict[str, Run] = {}
        probes = env.probes(tier, default_cache_dir()) if probe_repeats else {}

        def score_once(which: str) -> tuple[float | None, str]:
            if which not in runs:
                run, _ = start_run(env, tier, Path(tmp) / which.replace(":", "-").replace(" ", "-"),
                                   score_start=False, models=models, access=access)
                if which == "reference":
                    install_reference(run)
                elif which.startswith("probe:"):
                    place(probes[which.removeprefix("probe:")], run.workspace)
                runs[which] = run
            row = score_run(runs[which], kind="calibration", charged=False, access=access)
            return row.raw, row.message

        return calibrate(env, tier, repeats, score_once=score_once, command=command, on_progress=on_progress,
                         models=models, probes=list(probes), probe_repeats=probe_repeats)
