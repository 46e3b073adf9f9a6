"""The CPU tier's yardstick: the machine's current speed, measured by the scorer in the same scoring.

A shared or drifting virtual machine slows every call (the same starting solution took 123 ms on one
day and 217 ms on another), which alone moved the oracle's normalised score to 0.86. The yardstick is
a fixed workload shaped like the task: the reference's algorithm (reduce-then-scan, on two threads
started for each run, as the reference splits its work) in NumPy, on a fixed input. With one or two
busy processes on a 2-core machine, where the starting solution and the reference slowed x1.3-1.8,
a single-threaded NumPy scan slowed x1.1 and the start's PyTorch operations x3; this one follows the
start closely and the reference's short calls (which slow a little less) roughly. A solution's
milliseconds count as ms x (the yardstick's median at calibration / its time in this scoring).

It runs in the scorer, while every process of the solution is paused: once before each timed call
(after the scorer has prepared that call's input, so no cache state the solution left matters), and in
blocks before solution.py is imported and after every process of the solution is gone. The time between
calls counts, but never more than the slower block: a slowdown the solution could have caused outside
its own windows (kernel work it left behind, a process that escaped the pause) shortens nothing beyond
what the machine showed when none of its code could run. The block after the calls counts only inside
the scorer's PID namespace, where every process of the solution is known to be gone.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time

import numpy as np

PHASES = ("before", "between", "after")


def _wrap(v: int) -> int:
    """Python int to int32, wrapping as the int32 arithmetic of the task does."""
    return (v + 2**31) % 2**32 - 2**31


def _odd_before(a: np.ndarray, parity: int) -> np.ndarray:
    """1 where the number of positives before each element, counted from `parity`, is odd."""
    odd = np.empty(a.size, dtype=np.int32)
    odd[0] = 0
    np.cumsum(a[:-1] > 0, dtype=np.int32, out=odd[1:])
    odd &= 1
    if parity:
        odd ^= 1
    return odd


def _scan(a: np.ndarray, out: np.ndarray, parity: int, carry: int, state: list[int]) -> None:
    """The conditional prefix sum of `a` entered with (parity, carry); `state` gets what leaves it."""
    odd = _odd_before(a, parity)
    np.cumsum(a * odd, dtype=np.int32, out=out)
    out += np.int32(carry)
    state[:] = [int(odd[-1]) ^ int(a[-1] > 0), int(out[-1])]


def _summarise(a: np.ndarray, summary: list[int]) -> None:
    """Parity of the positives, the sum when entered with even parity, and the plain sum."""
    y0 = int(np.sum(a * _odd_before(a, 0), dtype=np.int32))
    summary[:] = [int(np.count_nonzero(a > 0)) & 1, y0, int(np.sum(a, dtype=np.int32))]


def reduce_then_scan(x: np.ndarray, out: np.ndarray) -> None:
    """The reference's CPU algorithm on two threads: chunks A | B | C; this thread scans A while a new
    thread summarises B; then this thread scans B while another new thread scans C."""
    n = x.size
    a = (n * 2 // 5) & ~63
    b = ((n - a) // 2) & ~63
    summary: list[int] = []
    state_a: list[int] = []
    state_b: list[int] = []
    helper = threading.Thread(target=_summarise, args=(x[a:a + b], summary))
    helper.start()
    _scan(x[:a], out[:a], 0, 0, state_a)
    helper.join()
    parity_a, carry_a = state_a
    parity_b, y0_b, total_b = summary
    carry_c = _wrap(carry_a + (total_b - y0_b if parity_a else y0_b))
    helper = threading.Thread(target=_scan, args=(x[a + b:], out[a + b:], parity_a ^ parity_b, carry_c, []))
    helper.start()
    _scan(x[a:a + b], out[a:a + b], parity_a, carry_a, state_b)
    helper.join()


class Yardstick:
    """One scoring's yardstick runs, by phase."""

    # The workload; tests replace it (this module runs only in the scorer's process).
    workload = staticmethod(reduce_then_scan)

    def __init__(self, length: int, nice: int) -> None:
        self.x = np.random.default_rng(0).integers(-10, 11, length, dtype=np.int32)  # the same every time
        self.out = np.empty_like(self.x)
        self.nice = nice
        self.times: dict[str, list[float]] = {phase: [] for phase in PHASES}

    def run(self, phase: str, count: int = 1) -> None:
        """Time the workload `count` times at `nice`, the solution's priority: the scorer's own raised
        priority would hide from the yardstick the contention the solution meets. On Linux a priority
        is a thread's own; the workload's threads inherit this thread's."""
        before = os.getpriority(os.PRIO_PROCESS, 0)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)
        try:
            for _ in range(count):
                t0 = time.perf_counter()
                self.workload(self.x, self.out)
                self.times[phase].append((time.perf_counter() - t0) * 1e3)
        finally:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, before)

    def current_ms(self, after_trusted: bool) -> float:
        """This scoring's yardstick time: the median between calls, at most the slower of the medians
        before the import and (where trusted) after the solution's processes are gone."""
        bound = statistics.median(self.times["before"])
        if after_trusted and self.times["after"]:
            bound = max(bound, statistics.median(self.times["after"]))
        return min(statistics.median(self.times["between"]), bound)
