"""Sandboxed code, unprivileged included, can use multiprocessing (its locks live in /dev/shm)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from openrebench.isolation import SandboxSpec, bwrap_command, bwrap_usable

CODE = "import multiprocessing as mp; mp.Lock(); print(mp.Pool(2).map(abs, [-1, -2]))"


@pytest.mark.skipif(bwrap_usable() is not None, reason="bubblewrap does not start here")
def test_multiprocessing_works_in_the_sandbox() -> None:
    result = subprocess.run(bwrap_command([sys.executable, "-c", CODE], SandboxSpec(binds=[], cwd="/")),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[1, 2]", result.stderr[-2000:]
