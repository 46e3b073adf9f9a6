"""Helpers of the adversarial suite: small tiers, scorings in-process or through `score_run`, the honest
answers the attacks compare with."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from openrebench.core import Run, ScoreResult, TierSpec
from openrebench.environments import get_environment

# Honest code the attacks build on: the exact answer of optimize_kernel.
EXPECTED = textwrap.dedent("""
    import time as _clock

    import torch

    def _expected(x):
        _clock.sleep(0.03)  # the work an attack tries to move out of the timed window: far above noise
        odd = torch.zeros_like(x, dtype=torch.int64)
        odd[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
        return (x.to(torch.int64) * odd).cumsum(0).to(torch.int32)
""")
HONEST_KERNEL = EXPECTED + "\n\ndef prefix_sum(x):\n    return _expected(x)\n"

KERNEL_PARAMS: dict[str, Any] = {"length": 2**15, "warmup_calls": 2, "timed_calls": 8, "call_timeout_s": 30,
                                 "setup_timeout_s": 60}


def small_tier(monkeypatch: pytest.MonkeyPatch, env_id: str, **params: Any) -> TierSpec:
    """The environment's mini tier with some parameters replaced, for scorings made in this process."""
    env = get_environment(env_id)
    spec = env.tier("mini")
    small = spec.model_copy(update={"params": {**spec.params, **params}})
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


def ms_of(result: ScoreResult) -> float | None:
    return None if result.raw is None else float(result.details["median_ms"])


def assert_one_row_per_scoring(run: Run, scorings: int) -> None:
    rows, warnings = run.rows()
    assert warnings == [] and len(rows) == scorings, (len(rows), warnings)
    assert [r.index for r in rows] == list(range(scorings))


def no_secret_in(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s and s in text]


def jdump(obj: Any) -> str:
    return json.dumps(obj)
