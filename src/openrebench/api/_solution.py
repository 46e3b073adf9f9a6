"""What every solution host does first: import the agent's file by path from the snapshot, and tell the
agent what went wrong in its own code. One definition, so that each environment's host keeps only its
own protocol (see `SolutionProcess` for how a host is started)."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType


def solution_traceback(exc: BaseException, solution_dir: Path) -> str:
    """The exception with only the frames in the agent's own files (what they need to debug; the host's
    frames would show the scorer's side)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(solution_dir))]
    where = "".join(traceback.format_list(frames[-5:]))
    return f"{type(exc).__name__}: {exc}" + (f"\n{where.rstrip()}" if where else "")


def import_solution(solution_dir: Path, filename: str = "solution.py") -> ModuleType | str:
    """The agent's `filename`, imported by path (as the module named by its stem, its folder then first on
    sys.path for its own imports), or a one-line reason it cannot be: missing, or failing to import
    (SystemExit and KeyboardInterrupt included: the agent's code must not end the host silently)."""
    path = solution_dir / filename
    if not path.is_file():
        return f"{filename} is missing from the workspace"
    name = Path(filename).stem
    sys.path.insert(0, str(solution_dir))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except BaseException as e:
        return f"{filename} failed to import: {solution_traceback(e, solution_dir)}"
    return module
