"""Where openrebench keeps built assets and calibration records (override with OPENREBENCH_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("OPENREBENCH_HOME")
    path = Path(root) if root else Path.home() / ".cache" / "openrebench"
    path.mkdir(parents=True, exist_ok=True)
    return path
