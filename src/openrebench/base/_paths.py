"""Where openrebench keeps built assets and calibration records (override with OPENREBENCH_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("OPENREBENCH_HOME")
    # Absolute, whatever the variable says: scorers and sandboxes run in other working directories.
    path = Path(root).expanduser().resolve() if root else Path.home() / ".cache" / "openrebench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform tells it, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
