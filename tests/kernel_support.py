"""optimize_kernel scored in the test process on a short input: the scorer's code runs here, the
solution host (the process that imports solution.py) is the real one, in its own process. Seconds
per scoring instead of the mini tier's quarter of a minute, for cases that need no sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from openrebench.api import ScoreResult, TierSpec
from openrebench.runs import get_environment

# OPENREBENCH_KERNEL_TEST_TIER=full runs the same scorings on the full tier's CUDA path (on a GPU node):
# windows of 16 calls on a 2**24-element input instead of single calls on 2**15 elements.
KERNEL_TIER = os.environ.get("OPENREBENCH_KERNEL_TEST_TIER", "mini")
if KERNEL_TIER not in ("mini", "full"):
    raise ValueError(f"OPENREBENCH_KERNEL_TEST_TIER must be mini or full, not {KERNEL_TIER!r}")
KERNEL_PARAMS: dict[str, Any] = (
    {"length": 2**15, "warmup_calls": 2, "timed_calls": 8, "call_timeout_s": 30, "setup_timeout_s": 60}
    if KERNEL_TIER == "mini" else
    {"length": 2**24, "warmup_calls": 2, "timed_calls": 8, "call_timeout_s": 60, "setup_timeout_s": 120})


def small_tier(monkeypatch: pytest.MonkeyPatch, env_id: str, tier: str = "mini",
               **params: Any) -> TierSpec[Any]:
    """The environment's tier with some parameters replaced (and checked by its params model), for
    scorings made in this process."""
    env = get_environment(env_id)
    spec = env.tier(tier)
    checked = spec.params.model_validate({**spec.params.model_dump(), **params})
    small = spec.model_copy(update={"params": checked})
    monkeypatch.setitem(type(env).tiers, tier, small)
    return small


def score_in_process(env_id: str, solution: Path, protected: Path, tier: str = "mini") -> ScoreResult:
    """The environment's scorer called here (its solution host still runs in a child process)."""
    return get_environment(env_id).score(tier, solution, protected)


def kernel_score(monkeypatch: pytest.MonkeyPatch, folder: Path, code: str, **params: Any) -> ScoreResult:
    small_tier(monkeypatch, "optimize_kernel", KERNEL_TIER, **{**KERNEL_PARAMS, **params})
    solution = folder / "solution"
    solution.mkdir(parents=True, exist_ok=True)
    (solution / "solution.py").write_text(code)
    (folder / "protected").mkdir(exist_ok=True)
    return score_in_process("optimize_kernel", solution, folder / "protected", KERNEL_TIER)


def write_reference_code(env_id: str = "optimize_kernel") -> str:
    """Python that writes the environment's reference solution.py (optimize_kernel's by default) into
    /workspace/solution.py: what a scripted model runs through the `python` tool to reach a valid, good
    solution."""
    import base64

    reference = (get_environment(env_id).root / "reference" / "solution.py").read_bytes()
    return (f"import base64\nopen('/workspace/solution.py', 'wb').write("
            f"base64.b64decode('{base64.b64encode(reference).decode()}'))\n")
