"""optimize_kernel's CPU yardstick: the reference's algorithm in NumPy, timed by the scorer at the
solution's priority, and the time it scales a scoring's milliseconds by."""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernel_support import kernel_score
from openrebench.environments.optimize_kernel._inputs import expected_output
from openrebench.environments.optimize_kernel._yardstick import Yardstick, reduce_then_scan
from openrebench.runs import get_environment

HONEST = """
import time
import torch

def prefix_sum(x):
    time.sleep(0.02)  # a time well above the protocol's noise, which the yardstick then scales
    odd = torch.zeros_like(x, dtype=torch.int64)
    odd[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
    return (x.to(torch.int64) * odd).cumsum(0).to(torch.int32)
"""


@pytest.mark.parametrize(("n", "low", "high"), [(200, -10, 11), (4099, 1, 11), (4099, -10, 1),
                                                (1 << 18, -10, 11), (1 << 18, -2**30, 2**30)])
def test_reduce_then_scan_is_the_conditional_prefix_sum(n: int, low: int, high: int) -> None:
    x = np.random.default_rng(n + abs(low)).integers(low, high, n, dtype=np.int32)
    out = np.empty_like(x)
    reduce_then_scan(x, out)
    assert np.array_equal(out, expected_output(torch.from_numpy(x)).numpy())


def _yardstick(before: list[float], between: list[float], after: list[float]) -> Yardstick:
    yard = Yardstick(256, 0)
    yard.times.update(before=before, between=between, after=after)
    return yard


def test_time_between_calls_counts_at_most_the_slower_trusted_block() -> None:
    assert _yardstick([10, 11, 12], [14, 15, 16], [13, 13, 13]).current_ms(after_trusted=True) == 13
    assert _yardstick([10, 11, 12], [14, 15, 16], [13, 13, 13]).current_ms(after_trusted=False) == 11
    assert _yardstick([10, 11, 12], [9, 9, 30], [13, 13, 13]).current_ms(after_trusted=True) == 9


def test_yardstick_runs_at_the_solutions_priority_and_restores_the_scorers() -> None:
    """Run in a thread of its own: on Linux a priority belongs to a thread, and lowering it is allowed
    to anyone (raising it back is not, without privileges)."""
    seen: list[int] = []

    def workload(x: np.ndarray, out: np.ndarray) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, 0))
        helper = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
        helper.start()
        helper.join()

    def scorer_thread() -> None:
        yard = Yardstick(256, min(os.getpriority(os.PRIO_PROCESS, 0) + 5, 19))
        yard.workload = workload  # type: ignore[method-assign]
        yard.run("between", 2)
        seen.append(os.getpriority(os.PRIO_PROCESS, 0))

    start = os.getpriority(os.PRIO_PROCESS, 0)
    thread = threading.Thread(target=scorer_thread)
    thread.start()
    thread.join()
    lowered = min(start + 5, 19)
    assert seen[:4] == [lowered] * 4
    if os.geteuid() == 0:
        assert seen[4] == start  # only a privileged scorer can go back up (and only one went up)


def test_tiers() -> None:
    env = get_environment("optimize_kernel")
    mini, full = env.tier("mini").params, env.tier("full").params
    assert mini.yardstick is not None and mini.yardstick.ms > 0 and full.yardstick is None
    assert "adjusted for the machine's current speed" in env.instructions("mini")
    assert "adjusted" not in env.instructions("full") and "$" not in env.instructions("full")


def _slowed_by(seconds: float):
    def workload(x: np.ndarray, out: np.ndarray) -> None:
        time.sleep(seconds)

    return workload


@pytest.mark.timing
def test_score_counts_milliseconds_relative_to_the_yardstick(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A yardstick made slower (a workload that sleeps) scales the counted time down by the same ratio."""
    ratios = {}
    for sleep_ms in (10, 30):
        monkeypatch.setattr(Yardstick, "workload", staticmethod(_slowed_by(sleep_ms / 1e3)))
        result = kernel_score(monkeypatch, tmp_path / str(sleep_ms), HONEST,
                              yardstick={"ms": 20.0, "length": 2**21, "block": 7})
        assert result.raw is not None, result.message
        d, y = result.details, result.details["yardstick"]
        assert sleep_ms <= y["ms"] < sleep_ms * 1.5 + 5 and y["ms_at_calibration"] == 20.0
        assert len(y["before_ms"]) == len(y["after_ms"]) == 7 and len(y["between_ms"]) == 8
        assert y["after_trusted"]  # the solution's cgroup was empty when the last block ran
        bound = max(statistics.median(y["before_ms"]), statistics.median(y["after_ms"]))
        assert y["ms"] == min(statistics.median(y["between_ms"]), bound)
        assert d["adjusted_ms"] == pytest.approx(d["median_ms"] * 20.0 / y["ms"])
        assert result.raw == pytest.approx(math.log(d["adjusted_ms"]))
        assert "the time counts as" in result.message
        ratios[sleep_ms] = d["adjusted_ms"] / d["median_ms"]
    assert ratios[10] / ratios[30] == pytest.approx(3, rel=0.3)
