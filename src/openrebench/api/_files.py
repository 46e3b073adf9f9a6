"""What goes where in a new run: the files an environment declares for one tier.

An environment says which files make up a run (`Environment.files`); the runs layer puts them in
place, the same way for every caller (a new run, calibration, the demo, the oracle agent, tests), so
no caller copies an environment's files itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from openrebench.base import OpenRebenchError

SKIPPED_DIRS = frozenset({"__pycache__"})  # never part of a run, wherever a folder holds one


@dataclass(frozen=True)
class Placement:
    """One entry of a run's files: `dest` (a relative POSIX path inside the workspace or the protected
    folder) receives `source` (a file, or a folder copied whole) or `content` (bytes made from the
    tier alone, such as a config filled in from its params).

    `link`: a hard link instead of a copy where the file system allows, for large inputs the scorer
    only reads; protected entries only (a link in the workspace would let the agent write into the
    cache). `public`: a protected entry whose bytes the agent also gets on purpose (the scorer's own
    trusted copy of an input); every other protected file must not appear in the workspace.
    """

    dest: str
    source: Path | None = None
    content: bytes | None = None
    link: bool = False
    public: bool = False

    def __post_init__(self) -> None:
        if (self.source is None) == (self.content is None):
            raise ValueError(f"{self.dest}: give exactly one of source and content")
        path = PurePosixPath(self.dest)
        if str(path) != self.dest or path.is_absolute() or self.dest in ("", ".") or ".." in path.parts:
            raise ValueError(f"{self.dest!r}: dest must be a plain relative path (no '..', no leading '/')")
        if self.link and self.source is None:
            raise ValueError(f"{self.dest}: only a copied source can be linked")

    @classmethod
    def copy(cls, source: Path, dest: str, *, link: bool = False, public: bool = False) -> Placement:
        return cls(dest=dest, source=Path(source), link=link, public=public)

    @classmethod
    def text(cls, dest: str, text: str, *, public: bool = False) -> Placement:
        return cls(dest=dest, content=text.encode(), public=public)

    def expand(self) -> list[tuple[str, Path | bytes]]:
        """The regular files this entry puts in place, as (dest, source file or content); a folder is
        walked in name order, without `__pycache__`. A missing source raises: it was not built."""
        if self.content is not None:
            return [(self.dest, self.content)]
        assert self.source is not None
        if self.source.is_file():
            return [(self.dest, self.source)]
        if not self.source.is_dir():
            raise OpenRebenchError(f"{self.source} (for {self.dest}) does not exist: the tier's assets are "
                                   "not built (starting a run builds them)")
        return [(f"{self.dest}/{f.relative_to(self.source).as_posix()}", f)
                for f in sorted(self.source.rglob("*"))
                if f.is_file() and not SKIPPED_DIRS & set(f.relative_to(self.source).parts)]


@dataclass(frozen=True)
class RunFiles:
    """A tier's files, in three lists placed in order (a later entry replaces an earlier one's file).

    `workspace`: the starting solution and the assets the agent gets. `protected`: what only the
    scorer reads (held-out data, ground truths, trusted copies of inputs). `reference`: the hidden
    reference solution, written over the workspace for demos, calibration, tests and the oracle agent.
    """

    workspace: Sequence[Placement] = field(default_factory=tuple)
    protected: Sequence[Placement] = field(default_factory=tuple)
    reference: Sequence[Placement] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("workspace", "protected", "reference"):
            entries = tuple(getattr(self, name))
            object.__setattr__(self, name, entries)
            if name != "protected" and any(p.link or p.public for p in entries):
                raise ValueError(f"{name} entries are plain copies (link and public are for protected ones)")


def file_contents(entries: Iterable[Placement]) -> Iterator[tuple[str, bytes]]:
    """Each file the entries put in place, as (dest, bytes): for writers that cannot copy from the host
    (the oracle agent writes the reference through the sandbox)."""
    for entry in entries:
        for dest, what in entry.expand():
            yield dest, what if isinstance(what, bytes) else what.read_bytes()
