"""Built assets: a folder with a manifest (what, source, seed, sizes, sha256 of every file, builder version).

Every asset is built into `<name>.partial/` and renamed into place only when complete, so a folder with
a manifest is a finished build. Builds are resumable: a builder keeps its intermediate state under
`<name>.partial/work/` and picks it up on the next call; a build that runs out of its time budget
stops between steps with `BuildIncomplete`. On reuse every file is checked against its checksum.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from openrebench.base import OpenRebenchError
from openrebench.base import cache_dir as default_cache_dir

from ._progress import stage

MANIFEST = "manifest.json"
WORK = "work"
_STATE = "build.json"
_STAMP = ".verified.json"  # size and mtime of each file when its sha256 last matched

OnMismatch = Literal["rebuild", "raise"]


class AssetError(OpenRebenchError):
    """A built asset is missing, corrupt or cannot be built here."""


class BuildIncomplete(OpenRebenchError):
    """A build stopped at its time budget; calling the same builder again resumes it."""

    def __init__(self, what: str, budget_s: float, done: str) -> None:
        super().__init__(f"{what}: stopped at its time budget of {budget_s:g} s ({done}); "
                         "run the same build again to resume where it stopped")
        self.what, self.budget_s, self.done = what, budget_s, done


class FileEntry(BaseModel):
    size: int
    sha256: str


class Manifest(BaseModel):
    """What a built asset is and how to check it; `key` decides whether a cached build can be reused."""

    what: str
    builder_version: str
    seed: int | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    source: dict[str, Any] = Field(default_factory=dict, description="Inputs: archives, versions, sha256s.")
    stats: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileEntry] = Field(default_factory=dict)
    build_seconds: float = 0.0
    created_at: datetime
    package_version: str

    def key(self) -> dict[str, Any]:
        return {"what": self.what, "builder_version": self.builder_version, "seed": self.seed,
                "params": self.params}


class Deadline:
    """A time budget for one call of a builder (None: unbounded)."""

    def __init__(self, what: str, budget_s: float | None) -> None:
        self.what, self.budget_s, self.start = what, budget_s, time.monotonic()

    @property
    def remaining_s(self) -> float | None:
        return None if self.budget_s is None else max(0.0, self.budget_s - (time.monotonic() - self.start))

    @property
    def expired(self) -> bool:
        return self.budget_s is not None and time.monotonic() - self.start >= self.budget_s

    def check(self, done: str) -> None:
        """Stop the build here (after a step whose results are saved) if the budget is spent."""
        if self.budget_s is not None and self.expired:
            raise BuildIncomplete(self.what, self.budget_s, done)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entries(folder: Path) -> dict[str, FileEntry]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, _STAMP))
    return {p.relative_to(folder).as_posix(): FileEntry(size=p.stat().st_size, sha256=sha256_file(p))
            for p in files}


def load_manifest(folder: Path) -> Manifest | None:
    path = folder / MANIFEST
    return Manifest.model_validate_json(path.read_text()) if path.is_file() else None


def verify(folder: Path, manifest: Manifest | None = None, *, full: bool = False) -> list[str]:
    """Problems found in a built asset (missing, resized or changed files); empty when it is intact.

    A file whose sha256 matched before and whose size and modification time have not changed since is
    not hashed again (large corpora take seconds to hash), unless `full`.
    """
    manifest = manifest or load_manifest(folder)
    if manifest is None:
        return [f"{folder / MANIFEST} is missing"]
    try:
        stamps = {} if full else json.loads((folder / _STAMP).read_text())
    except (OSError, ValueError):
        stamps = {}
    problems, checked = [], {}
    for name, entry in manifest.files.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        stat = path.stat()
        stamp = [stat.st_size, stat.st_mtime_ns]
        if stat.st_size != entry.size:
            problems.append(f"{name} has {stat.st_size} bytes, the manifest says {entry.size}")
        elif stamps.get(name) != stamp and sha256_file(path) != entry.sha256:
            problems.append(f"{name} does not match its sha256 in the manifest")
        else:
            checked[name] = stamp
    if not problems:
        with contextlib.suppress(OSError):  # a read-only copy is verified in full each time
            (folder / _STAMP).write_text(json.dumps(checked))
    return problems


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One builder per asset at a time (two processes asking for the same asset wait for each other)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def asset_key(*, what: str, builder_version: str, seed: int | None, params: dict[str, Any]) -> dict[str, Any]:
    """What a built asset's manifest must hold for `cached_build` to reuse it (`Manifest.key()`), in the
    form it takes in JSON (tuples become lists): data made elsewhere for the same key can stand in."""
    return json.loads(json.dumps({"what": what, "builder_version": builder_version, "seed": seed,
                                  "params": params}))


BuildFn = Callable[[Path, Deadline], tuple[dict[str, Any], dict[str, Any]]]


def cached_build(folder: Path, *, what: str, builder_version: str, seed: int | None, params: dict[str, Any],
                 build: BuildFn, time_budget_s: float | None = None, on_mismatch: OnMismatch = "rebuild",
                 label: str | None = None) -> Manifest:
    """Reuse the asset in `folder` if its manifest matches and its files check out, else (re)build it.

    `build(partial, deadline)` writes the asset's files into `partial` (scratch state in `partial/work`,
    kept between interrupted calls and removed at the end) and returns `(source, stats)` for the manifest.
    A build is a progress stage named `label` (default: `what`); a reuse reports nothing.
    """
    from openrebench import __version__

    key = asset_key(what=what, builder_version=builder_version, seed=seed, params=params)
    with _locked(folder):
        manifest = load_manifest(folder)
        if manifest is not None and manifest.key() == key:
            problems = verify(folder, manifest)
            if not problems:
                return manifest
            message = f"{what} in {folder} is corrupt: {'; '.join(problems)}"
            if on_mismatch == "raise":
                raise AssetError(message + " (delete the folder, or build again with on_mismatch='rebuild')")
            warnings.warn(message + "; rebuilding it", stacklevel=3)
        if folder.exists():
            shutil.rmtree(folder)
        partial = folder.with_name(folder.name + ".partial")
        state_path = partial / _STATE
        state = json.loads(state_path.read_text()) if state_path.is_file() else None
        if state is None or state.get("key") != key:
            shutil.rmtree(partial, ignore_errors=True)
            state = {"key": key, "elapsed_s": 0.0}
        (partial / WORK).mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state))
        started = time.monotonic()
        try:
            with stage(label or what):
                source, stats = build(partial, Deadline(what, time_budget_s))
        finally:
            state["elapsed_s"] += time.monotonic() - started
            if partial.exists():
                state_path.write_text(json.dumps(state))
        shutil.rmtree(partial / WORK)
        state_path.unlink()
        manifest = Manifest(**key, source=source, stats=stats, files=_entries(partial),
                            build_seconds=round(state["elapsed_s"], 3), created_at=datetime.now(UTC),
                            package_version=__version__)
        (partial / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        os.replace(partial, folder)
        return manifest


def assets_root(cache_dir: Path | None = None) -> Path:
    """Where language-model assets live: `<cache>/lm` (cache: ~/.cache/openrebench, or OPENREBENCH_HOME)."""
    return (cache_dir or default_cache_dir()) / "lm"

