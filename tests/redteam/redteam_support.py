"""Helpers of the adversarial suite: small tiers, scorings in-process or through `score_run`, the honest
answers the attacks compare with."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from kernel_support import KERNEL_PARAMS, kernel_score, score_in_process, small_tier
from openrebench.api import ScoreResult
from openrebench.runs import Run

# Honest code the attacks build on: the exact answer of optimize_kernel.
EXPECTED = textwrap.dedent("""
    import time as _clock

    import torch

    def _expected(x):
        _clock.sleep(0.06)  # the work an attack tries to move out of the timed window: far above noise
        odd = torch.zeros_like(x, dtype=torch.int64)
        odd[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
        return (x.to(torch.int64) * odd).cumsum(0).to(torch.int32)
""")
HONEST_KERNEL = EXPECTED + "\n\ndef prefix_sum(x):\n    return _expected(x)\n"
__all__ = ["KERNEL_PARAMS", "kernel_score", "score_in_process", "small_tier"]

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
