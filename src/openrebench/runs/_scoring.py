"""Scoring a run: snapshot the workspace, run the scorer in a separate, limited process, log the row;
setting up a run, and calibrating a tier, which score it."""

from __future__ import annotations

import contextlib
import errno
import json
import secrets
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from openrebench.api import (
    Environment,
    ScoreResult,
    TierSpec,
)
from openrebench.base import OpenRebenchError
from openrebench.isolation import (
    _janitor,
    all_gpu_nodes,
    measurement_slot,
    quiet_machine,
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
from ._scorer_process import (
    ScoringAccessFn,
    infrastructure_failure,
    score_solution,
    scoring_sandbox_default,
)
from ._snapshot import _NOTES, snapshot_workspace

PROTECTED_MANIFEST = "protected_manifest.json"


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


@dataclass(frozen=True)
class ScoringContext:
    """One scoring's inputs, gathered once and passed down whole: the run, the environment it carries,
    its tier, the time limit, and what the caller asked for. `sandboxed` and `devices` stay as asked
    (None: the default, resolved only once the snapshot is taken, where the scorer is started)."""

    run: Run
    env: Environment
    spec: TierSpec[Any]
    timeout_s: float
    sandboxed: bool | None = None
    devices: Sequence[str] | None = None
    access: ScoringAccessFn | None = None
    stop: threading.Event | None = None

    @classmethod
    def of(cls, run: Run, *, timeout_s: float | None = None, sandboxed: bool | None = None,
           devices: Sequence[str] | None = None, access: ScoringAccessFn | None = None,
           stop: threading.Event | None = None) -> ScoringContext:
        """The context of a scoring of `run` (see `score_run` for the arguments): its tier is read now,
        each scoring anew, and its environment is the run's own."""
        env = run.env
        spec = env.tier(run.info.tier)
        return cls(run, env, spec, timeout_s or spec.score_timeout_s, sandboxed, devices, access, stop)


def _score_snapshot(ctx: ScoringContext) -> tuple[ScoreResult, str, list[str]]:
    run, spec = ctx.run, ctx.spec
    with _tracked_temp_dir("openrebench-snapshot-") as tmp:
        snapshot = Path(tmp) / "solution"
        began = time.monotonic()
        try:
            sha, notes = snapshot_workspace(run.workspace, snapshot, int(spec.max_workspace_gb * 1024**3))
        except OpenRebenchError as e:
            return ScoreResult.invalid(f"Invalid: {e}."), "", []
        snapshot_s = round(time.monotonic() - began, 3)
        problem = _protected_problem(run)
        if problem:
            return infrastructure_failure(problem), sha, notes
        sandboxed = scoring_sandbox_default() if ctx.sandboxed is None else ctx.sandboxed
        devices = ctx.devices
        if devices is None:
            devices = all_gpu_nodes() if spec.device == "cuda" else []
        cache = Path(tmp) / "triton-cache" if spec.triton_cache and sandboxed else None
        if cache is not None:
            _kept_triton_cache(run, cache, load=True)
        with ctx.access(run, sandboxed) if ctx.access else nullcontext(None) as given:
            result = score_solution(ctx.env, spec.name, snapshot, run.protected, timeout_s=ctx.timeout_s,
                                memory_limit_gb=spec.memory_limit_gb, sandboxed=sandboxed, devices=devices,
                                access=given, stop=ctx.stop, triton_cache=cache)
            if cache is not None:
                result.details["triton_cache"] = _kept_triton_cache(run, cache, load=False)
            phases = result.details.get("harness_phases_s")
            if isinstance(phases, dict):
                result.details["harness_phases_s"] = {"snapshot": snapshot_s, **phases}
            failed = given.infrastructure() if given is not None and given.infrastructure else None
            if given is not None and given.report is not None:  # after: it says what the check found
                result.details.update(given.report())
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
    These travel down as one `ScoringContext`, with the environment the run carries (`Run.env`).
    """
    started = time.monotonic()
    sha, notes, interrupted = "", [], None
    try:
        if refused is not None:
            result = infrastructure_failure(f"scoring refused: {refused}")
        else:
            with measurement_slot():  # no calibration of the machine meanwhile (isolation._quiet)
                result, sha, notes = _score_snapshot(ScoringContext.of(
                    run, timeout_s=timeout_s, sandboxed=sandboxed, devices=devices, access=access, stop=stop))
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
    run = Run(path, run.info, env)
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
    # The machine to itself: no scoring anywhere on it meanwhile, every attempt's agent frozen.
    with (tempfile.TemporaryDirectory(prefix="openrebench-calibrate-") as tmp, bootstrapping(),
          quiet_machine()):
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

