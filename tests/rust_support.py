"""Shared by the rust_codecontests tests: running rustc and programs as the scoring sandbox's
unprivileged uid (65534) outside the sandbox, where root's toolchain is out of that uid's reach."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from openrebench.environments.rust_codecontests import rust_utils

SETPRIV = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", "--"]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="dropping to uid 65534 needs root and setpriv")


def open_dir(mode: int = 0o755, prefix: str = "rcc-test-") -> Path:
    """A fresh folder under /tmp that uid 65534 may enter (pytest's own tmp folders are root-only)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(mode)
    return d


def runs_as_nobody(rustc: str) -> bool:
    try:
        return subprocess.run([*SETPRIV, rustc, "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _link_mirror(sysroot: Path, dest: Path) -> None:
    """bin/ and lib/ of a toolchain as hard links under open folders: a toolchain under a root-only home
    (~/.rustup as root) is then usable by 65534 without copying 600 MB (the scorer mounts it instead)."""
    for top in ("bin", "lib"):
        for dirpath, _, filenames in os.walk(sysroot / top):
            here = dest / Path(dirpath).relative_to(sysroot)
            here.mkdir(parents=True, exist_ok=True)
            here.chmod(0o755)
            for name in filenames:
                src = Path(dirpath) / name
                if src.is_symlink():
                    (here / name).symlink_to(os.readlink(src))
                else:
                    os.link(src, here / name)


@contextlib.contextmanager
def nobody_rustc() -> Iterator[str]:
    """A rustc that uid 65534 can run: the found one, or a hard-link mirror of its toolchain (skips the
    test where neither can be had)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping to uid 65534 needs root and setpriv")
    rustc = rust_utils.find_rustc()
    assert rustc is not None
    if runs_as_nobody(rustc):
        yield rustc
        return
    mirror = open_dir()
    try:
        try:
            _link_mirror(Path(rustc).parents[1], mirror)
        except OSError as e:
            pytest.skip(f"the toolchain is not readable by uid 65534 and cannot be mirrored: {e}")
        if not runs_as_nobody(str(mirror / "bin" / "rustc")):
            pytest.skip("uid 65534 cannot run rustc")
        yield str(mirror / "bin" / "rustc")
    finally:
        shutil.rmtree(mirror, ignore_errors=True)
