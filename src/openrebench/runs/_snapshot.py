"""The workspace snapshot a scoring reads: copied without following links, within limits that count
what is there, so that nothing the agent does to its files while or before they are copied can
reach outside the workspace, stall the copy or be scored half-written."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

from openrebench.base import OpenRebenchError

MAX_SNAPSHOT_BYTES = 4 * 1024**3  # the default; a tier may set its own (TierSpec.max_workspace_gb)
MAX_SNAPSHOT_FILES = 200_000
MAX_SNAPSHOT_DEPTH = 64
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

