"""Scoring optimize_finetune: the agent's finetune.sh on fresh inputs, timed from outside, then the
reference pipeline on the same inputs, then the two sets of weights compared.

Every scoring draws a fresh seed (written into the solution's finetune.yaml) and a fresh sample of
the records (finetune_data.jsonl), restores the initial model and the tokenizer and deletes any old
trained_model/, so weights from an earlier run, copied, or made any way but by training on these
inputs do not match. finetune.sh runs as a child of this process (in the scoring sandbox as an
unprivileged user, who cannot read protected/); its wall-clock time is measured here, from its start
until it and every process it started have exited, so nothing it does to its own clocks changes the
time. "Every process" is the kernel's word: the run goes into a cgroup (the harness's sub-group of the
scoring's cgroup, bound into the sandbox; outside one, a group made here; the process tree and session
only where no cgroup can be made, said in the details' `accounting`), and the clock stops when no thread
is left in it. Work still running GRACE_S after finetune.sh exits is frozen, killed and makes the
scoring invalid. The reference run starts only once that group is empty, with nothing the solution
wrote on its way (a fresh root-only home for its temporary files and caches, inputs from protected/).
No code of the agent's runs in this process: the weights are read as safetensors.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from openrebench.api import RUN_CGROUP_ENV, ScoreResult, TierSpec, solution_prefix, solution_uid
from openrebench.isolation import Cgroup, janitor_pid

from ._weights import Weights, WeightsError, check_architecture, distances, unchanged
from .env import CONFIG, DATA, OUTPUT_DIR, Setup
from .params import FinetuneParams

SEED_LINE = re.compile(r"^seed:[^\n]*$", re.MULTILINE)
GRACE_S = 5.0  # how long processes may outlive finetune.sh (e.g. multiprocessing's resource tracker)


def set_seed(config: str, seed: int) -> str | None:
    """The config with its top-level `seed:` line set to `seed`; None if it has no single such line."""
    if len(SEED_LINE.findall(config)) != 1:
        return None
    patched = SEED_LINE.sub(f"seed: {seed}", config)
    try:
        parsed = yaml.safe_load(patched)
    except yaml.YAMLError:
        return None
    return patched if isinstance(parsed, dict) and parsed.get("seed") == seed else None


@dataclass
class Outcome:
    seconds: float
    started_at: float  # wall clock (time.time) at the start, for file times
    exit_code: int | None  # None: stopped at the time limit
    stragglers: int  # processes still running GRACE_S after finetune.sh exited (killed)
    tail: str


CACHE_VARS = ("TMPDIR", "TEMP", "TMP", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME",
              "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "PYTHONPYCACHEPREFIX")


def _child_env(home: str, threads: int | None) -> dict[str, str]:
    """The scorer's environment, with a fresh home holding every temporary file and cache (nothing
    carries over between scorings, and nothing the solution wrote elsewhere, /tmp/triton say, reaches
    the reference run), offline; with `threads`, a default for the math libraries' thread pools.
    `python` and `python3` are the scorer's own interpreter (small wrappers, so that a virtual
    environment stays one), then its bin folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREBENCH_")}
    wrappers = Path(home) / "bin"
    wrappers.mkdir()
    for name in ("python", "python3"):
        (wrappers / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (wrappers / name).chmod(0o755)
    path = f"{wrappers}:{os.path.dirname(sys.executable)}:{env.get('PATH', '/usr/bin:/bin')}"
    caches = {"TRITON_CACHE_DIR": "cache/triton", "TORCHINDUCTOR_CACHE_DIR": "cache/torchinductor",
              "HF_HOME": "cache/huggingface", "XDG_CACHE_HOME": "cache", "CUDA_CACHE_PATH": "cache/nv"}
    for folder in ("tmp", *caches.values()):
        Path(home, folder).mkdir(parents=True, exist_ok=True)
    for name in CACHE_VARS:
        env.pop(name, None)
    env.update({name: f"{home}/{folder}" for name, folder in caches.items()})
    env.update(PATH=path, HOME=home, TMPDIR=f"{home}/tmp", PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _become_subreaper() -> bool:
    """Orphaned descendants (double-forked, setsid daemons) become this process's children, not init's,
    so that they are reaped here (and, without a cgroup, found and killed; elsewhere the session is used)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _alive(p: psutil.Process) -> bool:
    """Running, or a zombie leader whose other threads still work."""
    if p.status() != psutil.STATUS_ZOMBIE:
        return True
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{p.pid}/task")) > 1
    return False


def _processes(session: int | None) -> list[psutil.Process]:
    """Live processes the run started (fallback without a cgroup): this process's descendants (and,
    without a subreaper, anything left in the run's session), but for this process's janitor, which a
    subreaper inherits when the shell that started it exits."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process().children(recursive=True))
    found.pop(janitor_pid() or -1, None)
    for p in psutil.process_iter() if session is not None else []:
        with contextlib.suppress(psutil.Error, OSError):
            if p.pid != os.getpid() and os.getsid(p.pid) == session:
                found[p.pid] = p
    live = []
    for p in found.values():
        with contextlib.suppress(psutil.Error):
            if _alive(p):
                live.append(p)
    return live


def _kill(processes: list[psutil.Process]) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(processes, timeout=5)
    _reap()


def _reap() -> None:
    """Reap orphans that were handed to this process (the subreaper)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def pipeline_cgroup() -> tuple[Cgroup | None, str]:
    """The cgroup that timed runs go into, and how it was had: the one the harness made for this
    scoring and bound into the sandbox (its paths in $OPENREBENCH_RUN_CGROUP), else one made here
    (root outside a sandbox), else None: then processes are found by walking the process tree."""
    given = [Path(p) for p in os.environ.get(RUN_CGROUP_ENV, "").split(":") if p]
    if given:
        group = Cgroup.attach(given)
        if group is not None:
            return group, f"cgroup {group.version} (made by the harness)"
    group = Cgroup.create("finetune", memory_bytes=None, max_pids=None)
    if group is not None:
        return group, f"cgroup {group.version} (made by the scorer)"
    return None, "process tree and session (no cgroup could be made)"


def run_pipeline(folder: Path, timeout_s: float, *, drop: bool, threads: int | None = None,
                 cgroup: Cgroup | None = None) -> Outcome:
    """Run `bash finetune.sh` in `folder`; with `drop`, as the unprivileged sandbox user. With `cgroup`
    (empty), the run is in it: its time ends when no thread is left in the group, whatever became of
    the processes (daemons, zombie leaders with working threads); without, the process tree is walked."""
    if cgroup is not None and not cgroup.wait_empty(5):
        raise RuntimeError("the cgroup for the run is not empty")
    uid = solution_uid() if drop else None
    prefix = solution_prefix() if uid is not None else []
    reaper = _become_subreaper()
    with tempfile.TemporaryDirectory(prefix="finetune-log-") as logs, \
            tempfile.TemporaryDirectory(prefix="finetune-home-") as home:
        env = _child_env(home, threads)
        if uid is not None:
            _give(Path(home), uid)
        log_path = Path(logs) / "output.log"
        # A gate: the shell waits on its stdin until it is in the cgroup, then runs finetune.sh.
        gate = ["/bin/sh", "-c", 'read -r _ && exec "$@" </dev/null', "openrebench-gate"] if cgroup else []
        with open(log_path, "wb") as log:
            started_at, t0 = time.time(), time.monotonic()
            proc = subprocess.Popen([*gate, *prefix, "bash", "finetune.sh"], cwd=folder,
                                    stdin=subprocess.PIPE if cgroup else subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            if cgroup is not None:
                assert proc.stdin is not None
                try:
                    cgroup.add(proc.pid)
                except OSError:
                    proc.kill()
                    proc.wait()
                    raise
                with contextlib.suppress(OSError):
                    proc.stdin.write(b"go\n")
                    proc.stdin.close()
                seconds, code, stragglers = _wait_cgroup(proc, cgroup, t0, timeout_s)
            else:
                seconds, code, stragglers = _wait_tree(proc, None if reaper else proc.pid, t0, timeout_s)
        text = log_path.read_bytes()[-20000:].decode(errors="replace")
    tail = "\n".join(text.strip().splitlines()[-15:])[-2000:]
    return Outcome(seconds=seconds, started_at=started_at, exit_code=code,
                   stragglers=stragglers if code is not None else 0, tail=tail)


def _wait_cgroup(proc: subprocess.Popen[bytes], cgroup: Cgroup, t0: float,
                 timeout_s: float) -> tuple[float, int | None, int]:
    """Seconds until the group is empty, finetune.sh's exit code (None: out of time) and how many
    processes were still in the group GRACE_S after it exited (frozen and killed)."""
    deadline, grace_end = t0 + timeout_s, None
    while True:
        code = proc.poll()
        now = time.monotonic()
        if code is not None:
            if not cgroup.tasks():
                seconds = time.monotonic() - t0
                _reap()
                return seconds, code, 0
            grace_end = grace_end or now + GRACE_S
        if now > (grace_end or deadline):
            seconds = now - t0
            left = len(cgroup.pids()) or 1
            if not cgroup.kill_all():
                raise RuntimeError("the processes of the run could not be killed")
            proc.wait()
            _reap()
            return seconds, code, left
        _reap()
        time.sleep(0.01)


def _wait_tree(proc: subprocess.Popen[bytes], session: int | None, t0: float,
               timeout_s: float) -> tuple[float, int | None, int]:
    """The fallback without a cgroup: finetune.sh's exit, then its descendants (or its session)."""
    code: int | None
    try:
        code = proc.wait(timeout=max(0.0, t0 + timeout_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    deadline = time.monotonic() + GRACE_S
    while code is not None and _processes(session) and time.monotonic() < deadline:
        time.sleep(0.02)
    seconds = time.monotonic() - t0
    stragglers = _processes(session)
    _kill(stragglers)
    if code is None:
        proc.kill()
        proc.wait()
    return seconds, code, len(stragglers)


def _failure(outcome: Outcome, timeout_s: float) -> str | None:
    """Why a run did not finish properly, or None."""
    if outcome.exit_code is None:
        return f"finetune.sh did not finish within {timeout_s:g} s"
    if outcome.stragglers:
        return (f"finetune.sh exited while {outcome.stragglers} process(es) it started kept running for more "
                f"than {GRACE_S:g} s (they were killed): all work must be finished when it exits")
    if outcome.exit_code != 0:
        return f"finetune.sh exited with code {outcome.exit_code}"
    return None


def _with_tail(message: str, outcome: Outcome) -> str:
    """The message of a failed run, without its output: the pipeline ran on the scoring's held-out
    records and seed, and its output could carry them (the tail is in the row's hidden details)."""
    return (f"{message} (its output is not shown: a scoring's data is held out; run finetune.sh in the "
            "workspace to see why)")


def _give(path: Path, uid: int | None) -> None:
    if uid is None:
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, uid, uid)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def prepare_inputs(folder: Path, protected: Path, seed: int, records: list[str], config: str,
                   owner: int | None, *, link: bool = False) -> None:
    """This scoring's inputs in `folder`: the config with the seed, the data, the initial model and the
    tokenizer (copies, or links for the scorer's own run); any old output removed."""
    for name in (CONFIG, DATA, "initial_model", "tokenizer", OUTPUT_DIR):
        _remove(folder / name)
    (folder / CONFIG).write_text(config)
    (folder / DATA).write_text("".join(records))
    for name in ("initial_model", "tokenizer"):
        if link:
            (folder / name).symlink_to(protected / name)
        else:
            shutil.copytree(protected / name, folder / name)
    for name in (CONFIG, DATA, "initial_model", "tokenizer"):
        _give(folder / name, owner)


def _written_before(folder: Path, started_at: float) -> str | None:
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.stat().st_mtime < started_at - 2:
            return f.name
    return None


@contextlib.contextmanager
def reference_run(protected: Path, seed: int, records: list[str], timeout_s: float, *, threads: int | None,
                  cgroup: Cgroup | None) -> Iterator[tuple[Outcome, Path]]:
    """The trusted pipeline on this scoring's inputs, as root, in a fresh folder only root can enter:
    its scripts, config, model and tokenizer come from protected/ (read-only to everyone, unreadable to
    the solution), its records from the scorer's memory, its temporary files and caches from its own
    fresh home (see _child_env). Yields the outcome and the folder of its weights."""
    with tempfile.TemporaryDirectory(prefix="finetune-reference-") as tmp:
        work = Path(tmp)
        for f in (protected / "reference").iterdir():
            shutil.copyfile(f, work / f.name)
        official = set_seed((protected / CONFIG).read_text(), seed)
        assert official is not None
        prepare_inputs(work, protected, seed, records, official, None, link=True)
        yield run_pipeline(work, timeout_s, drop=False, threads=threads, cgroup=cgroup), work / OUTPUT_DIR


def _clear_left_files(uid: int) -> None:
    """Remove what `uid` left in the scoring sandbox's own /tmp and /dev/shm (its processes are dead)."""
    for top in ("/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            for entry in os.scandir(top):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


def score(spec: TierSpec[FinetuneParams], solution: Path, protected: Path) -> ScoreResult:
    cgroup, accounting = pipeline_cgroup()
    try:
        result = _score(spec, solution, protected, cgroup)
    finally:
        if cgroup is not None:
            cgroup.close()
    result.details["accounting"] = accounting
    return result


def _score(spec: TierSpec[FinetuneParams], solution: Path, protected: Path,
           cgroup: Cgroup | None) -> ScoreResult:
    p = spec.params
    setup = Setup.model_validate_json((protected / "setup.json").read_text())
    uid = solution_uid()
    drop = uid is not None
    seed = secrets.randbelow(2**31 - 1)
    pool = (protected / "pool.jsonl").read_text().splitlines(keepends=True)
    records = random.Random(secrets.randbits(64)).sample(pool, setup.records)

    config_path = solution / CONFIG
    config = set_seed(config_path.read_text(errors="replace"), seed) if config_path.is_file() else None
    if config is None:
        return ScoreResult.invalid(f"Invalid: {CONFIG} must keep exactly one top-level `seed:` line "
                                   "(the scorer sets a fresh seed there at every scoring).")
    if not (solution / "finetune.sh").is_file():
        return ScoreResult.invalid("Invalid: there is no finetune.sh in the workspace.")
    prepare_inputs(solution, protected, seed, records, config, uid)
    details: dict[str, object] = {"seed": seed, "records": len(records)}

    timeout = float(p.run_timeout_s)
    run = run_pipeline(solution, timeout, drop=drop, threads=p.threads)
    details.update(seconds=run.seconds, exit_code=run.exit_code, output_tail=run.tail)
    failure = _failure(run, timeout)
    if failure:
        return ScoreResult.invalid(_with_tail(f"Invalid: {failure}", run), **details)

    output = solution / OUTPUT_DIR
    try:
        if not output.is_dir() or output.is_symlink():
            raise WeightsError(f"finetune.sh did not write {OUTPUT_DIR}/")
        links = [f.name for f in output.rglob("*") if f.is_symlink()]
        if links:  # the names are the pipeline's: not quoted
            raise WeightsError(f"{OUTPUT_DIR}/ must hold regular files, not links ({len(links)} found)")
        agent, initial = Weights(output), Weights(protected / "initial_model")
        problem = check_architecture(agent, initial)
        if problem:
            raise WeightsError(f"{OUTPUT_DIR}/ is not the initial model's architecture: {problem}")
        stale = _written_before(output, run.started_at)
        if stale:
            raise WeightsError(f"a file of {OUTPUT_DIR}/ was last modified before finetune.sh started; the "
                               "weights must be written by the run itself")
        if unchanged(agent, initial):
            raise WeightsError(f"{OUTPUT_DIR}/ holds the initial weights unchanged: finetune.sh must train "
                               "the model")
    except WeightsError as e:
        return ScoreResult.invalid(_with_tail(f"Invalid: {e}", run), **details)

    # Nothing of the solution's may run, or be read, during the yardstick run: its group is empty (it
    # ended empty, or was frozen and killed), and what it left in /tmp and /dev/shm goes.
    if cgroup is not None and not cgroup.wait_empty(5):
        return ScoreResult.invalid("Invalid: the scorer could not stop the solution's processes.", **details)
    if uid is not None:
        _clear_left_files(uid)
    ref_timeout = float(p.reference_timeout_s)
    with reference_run(protected, seed, records, ref_timeout, threads=p.threads,
                       cgroup=cgroup) as (ref_run, ref_weights):
        details.update(reference_seconds=ref_run.seconds)
        failure = _failure(ref_run, ref_timeout)
        if failure:
            return ScoreResult.invalid(f"Invalid: the scorer's own reference run failed ({failure}); this is "
                                       "not the solution's fault, please report it.",
                                       **details, reference_tail=ref_run.tail)
        try:
            d = distances(agent, Weights(ref_weights), initial)
        except WeightsError as e:
            return ScoreResult.invalid(f"Invalid: {OUTPUT_DIR}/: {e}.", **details)
    details.update(distances=d.model_dump(), relative_l1=d.relative)

    tolerance, least = p.max_relative_l1, p.min_update_share
    if d.agent_initial < least * d.reference_initial:
        return ScoreResult.invalid(
            f"Invalid: the weights moved only {d.agent_initial:.4g} (L1) from the initial ones, against "
            f"{d.reference_initial:.4g} for this scoring's reference run: the training did not (fully) run.",
            **details)
    if d.relative > tolerance:
        return ScoreResult.invalid(
            f"Invalid: the weights differ from this scoring's reference run by L1 {d.agent_reference:.4g}, "
            f"{_pct(d.relative)} of the reference run's own change from the initial weights (tolerance "
            f"{_pct(tolerance)}). Each scoring uses a fresh seed and a fresh sample of the data: the weights "
            "must come from training on them with the settings of the original finetune.yaml.", **details)
    seconds, speed_note = run.seconds, ""
    if p.reference_run_s:  # machine-speed drift: the trusted run of this scoring is the yardstick
        seconds = run.seconds * p.reference_run_s / ref_run.seconds
        details.update(adjusted_seconds=seconds)
        speed_note = (f"; this scoring's reference run took {ref_run.seconds:.2f} s against "
                      f"{p.reference_run_s:.2f} s at calibration, so the time counts as "
                      f"{seconds:.2f} s")
    raw = math.log(seconds)
    return ScoreResult(raw=raw, details=details, message=(
        f"Valid: finetune.sh took {run.seconds:.2f} s (timed by the scorer); its weights differ from this "
        f"scoring's reference run by {_pct(d.relative)} of the training's change "
        f"(L1 {d.agent_reference:.4g}; tolerance {_pct(tolerance)}){speed_note}; "
        f"score ln(seconds) = {raw:.4f}"))


def _pct(share: float) -> str:
    return f"{100 * share:.3g}%"

