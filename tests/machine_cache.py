"""The machine's own cache, as the environment named it before any test moved OPENREBENCH_HOME.

Built files that are the same whoever builds them (the offline model, downloaded sources, the mini
assets the session's fixtures build, each under its build key) are kept there between sessions, as
`make demo` keeps its own: a session builds them only on a machine that has none. Anything a test
writes for itself stays in its own temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Read when the suite's conftest imports this module, before any fixture sets OPENREBENCH_HOME.
_NAMED = os.environ.get("OPENREBENCH_HOME")
MACHINE_CACHE = Path(_NAMED).expanduser().resolve() if _NAMED else Path.home() / ".cache" / "openrebench"


def machine_folder(path: Path | str) -> Path | None:
    """`path` (under the machine's cache when relative), made if missing; None where it cannot be
    written (a read-only home): the caller falls back to a folder of the session."""
    folder = MACHINE_CACHE / path
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def kept_folder(path: Path | str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`machine_folder(path)`, or where the machine's cache cannot be written, a folder of the session
    named as `path`'s last part, one for all xdist workers."""
    folder = machine_folder(path)
    if folder is None:
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / Path(path).name
        folder.mkdir(exist_ok=True)
    return folder
