"""optimize_kernel scored in the test process on a short input: the scorer's code runs here, the
solution host (the process that imports solution.py) is the real one, in its own process. Seconds
per scoring instead of the mini tier's quarter of a minute, for cases that need no sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openrebench.api import ScoreResult, TierSpec
from openrebench.runs import get_environment

KERNEL_PARAMS: dict[str, Any] = {"length": 2**15, "warmup_calls": 2, "timed_calls": 8, "call_timeout_s": 30,
                                 "setup_timeout_s": 60}


def small_tier(monkeypatch: pytest.MonkeyPatch, env_id: str, **params: Any) -> TierSpec[Any]:
    """The environment's mini tier with some parameters replaced (and checked by its params model), for
    scorings made in this process."""
    env = get_environment(env_id)
    spec = env.tier("mini")
    checked = spec.params.model_validate({**spec.params.model_dump(), **params})
    small = spec.model_copy(update={"params": checked})
    monkeypatch.setitem(type(env).tiers, "mini", small)
    return small


def score_in_process(env_id: str, solution: Path, protected: Path) -> ScoreResult:
    """The environment's scorer called here (its solution host still runs in a child process)."""
    return get_environment(env_id).score("mini", solution, protected)


def kernel_score(monkeypatch: pytest.MonkeyPatch, folder: Path, code: str, **params: Any) -> ScoreResult:
    small_tier(monkeypatch, "optimize_kernel", **{**KERNEL_PARAMS, **params})
    solution = folder / "solution"
    solution.mkdir(parents=True, exist_ok=True)
    (solution / "solution.py").write_text(code)
    (folder / "protected").mkdir(exist_ok=True)
    return score_in_process("optimize_kernel", solution, folder / "protected")
