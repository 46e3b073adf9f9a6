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


def usable_cores(at_most: int | None = None) -> int:
    """The CPU cores this process may run on (its affinity where the platform tells it, else all), or
    `at_most` where that is fewer: the threads a job asks for, never more than it can use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, at_most) if at_most is not None else cores
