"""Putting an environment's declared files in place: the one way a run's workspace, protected folder
and reference solution are filled, whoever asks (a new run, calibration, the demo, tests)."""

from __future__ import annotations

import hashlib
import shutil
import stat
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from openrebench.api import Environment, OpenRebenchError, Placement, RunFiles
from openrebench.base import cache_dir as default_cache_dir

from ._run import Run

if TYPE_CHECKING:
    from ._scorer_process import ScoringAccessFn


def place(entries: Sequence[Placement], root: Path) -> list[str]:
    """Put the entries under `root` in order (a later one replaces an earlier one's file) and return
    the paths written. A file already there is replaced, not written through: a link left in its
    place (by an agent, say) is removed, never followed, and no entry lands outside `root`.

    Copies are rw-r--r--, or rwxr-xr-x where the source is executable (a script), whatever the
    source's other bits or the umask: a run's files are the same on every machine. A hard link is
    the source's own file."""
    root = root.absolute()
    written: list[str] = []
    for entry in entries:
        for dest, what in entry.expand():
            target = root / dest
            if not target.parent.resolve().is_relative_to(root.resolve()):
                raise OpenRebenchError(f"{dest}: its folder leads outside {root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            _put(target, what, entry.link)
            written.append(dest)
    return written


def _put(target: Path, what: Path | bytes, link: bool) -> None:
    if isinstance(what, bytes):
        target.write_bytes(what)
        target.chmod(0o644)
        return
    if link:
        try:
            target.hardlink_to(what)
            return
        except OSError:  # another file system, or links not allowed: a copy
            pass
    shutil.copyfile(what, target)
    target.chmod(0o755 if what.stat().st_mode & stat.S_IXUSR else 0o644)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def protected_leaks(workspace: Path, protected: Path, public: Collection[str] = ()) -> list[str]:
    """Workspace files that hold the bytes of a protected file (but those in `public`, the protected
    paths the agent may see), as "workspace path = protected path". Only files of a protected file's
    size are read, so the check costs little even beside large assets."""
    secret: dict[int, list[Path]] = {}
    for f in sorted(protected.rglob("*")):
        rel = f.relative_to(protected).as_posix()
        if f.is_file() and not f.is_symlink() and f.stat().st_size > 0 and rel not in public:
            secret.setdefault(f.stat().st_size, []).append(f)
    digests: dict[Path, str] = {}
    leaks = []
    for f in sorted(workspace.rglob("*")):
        if not f.is_file() or f.is_symlink() or f.stat().st_size not in secret:
            continue
        for p in secret[f.stat().st_size]:
            if p not in digests:
                digests[p] = _sha256(p)
            if _sha256(f) == digests[p]:
                leaks.append(f"{f.relative_to(workspace).as_posix()} = {p.relative_to(protected).as_posix()}")
    return leaks


def set_up_files(run: Run, env: Environment, cache_dir: Path,
                 access: ScoringAccessFn | None = None) -> None:
    """Fill a new run's workspace and protected folder: the tier's assets built (those that need the
    tier's models through `access`, granted for the build), its declared files placed, then the files
    the environment writes per run; refuses a workspace that holds protected data."""
    tier = run.info.tier
    build_assets(run, env, cache_dir, access)
    files = run_files(run, cache_dir)
    place(files.workspace, run.workspace)
    public: set[str] = set()
    for entry in files.protected:
        written = set(place([entry], run.protected))
        public = public | written if entry.public else public - written
    env.write_run_files(tier, run.workspace, run.protected, cache_dir)
    if leaks := protected_leaks(run.workspace, run.protected, public):
        raise OpenRebenchError(f"{env.id} ({tier}) put protected data into the workspace: {', '.join(leaks)} "
                               "(a protected entry the agent may see is declared public)")


def build_assets(run: Run, env: Environment, cache_dir: Path, access: ScoringAccessFn | None = None) -> None:
    """The run's tier's assets: `build_assets`, then `build_with_models` where the environment builds
    with its tier's models (which `access` gives; without it, a one-line error before any build)."""
    tier = run.info.tier
    with_models = env.builds_with_models and bool(env.tier(tier).models)
    if with_models and access is None:
        roles = ", ".join(env.tier(tier).models)
        raise OpenRebenchError(f"{env.id} ({tier}) builds assets with its models ({roles}), and none were "
                               "given to this set-up")
    env.build_assets(tier, cache_dir)
    if not with_models:
        return
    assert access is not None
    with access(run, False, build=True) as given:
        if given is None:
            raise OpenRebenchError(f"{env.id} ({tier}) builds assets with its models, and none were granted")
        env.build_with_models(tier, cache_dir, given)


def install_reference(run: Run, cache_dir: Path | None = None) -> list[str]:
    """Write the run's reference solution over its workspace (for the demo, calibration and tests);
    returns the paths written. The tier is the run's; its assets must be built (the run's set-up
    built them)."""
    return place(run_files(run, cache_dir).reference, run.workspace)


def run_files(run: Run, cache_dir: Path | None = None) -> RunFiles:
    """A run's declared files: the tier's (`files`), then those built for the run's models
    (`model_files`), each list in that order."""
    env, tier, cache = run.env, run.info.tier, cache_dir or default_cache_dir()
    files = env.files(tier, cache)
    if not run.info.models or type(env).model_files is Environment.model_files:
        return files
    more = env.model_files(tier, cache, run.info.models)
    return RunFiles(workspace=[*files.workspace, *more.workspace],
                    protected=[*files.protected, *more.protected],
                    reference=[*files.reference, *more.reference])
