"""The optimize_kernel scorer: exact correctness on fresh inputs, then timing, in a separate host.

Runs in the scorer process. Inputs come from seeds drawn fresh for every scoring; the expected
outputs are computed here, never in the process that runs the solution. Timing is the median of
the host's measurements (CUDA events on GPU, perf_counter on CPU), cross-checked against round
trips timed from this side so that a host whose timer was subverted cannot report a faster time.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from openrebench.core import ScoreResult, SolutionError, SolutionProcess, TierSpec

from ._inputs import Digester, expected_output, make_input

HOST_MODULE = "openrebench.environments.optimize_kernel._host"
# A host must not report less than this share of the fastest call the scorer saw (round trip minus the
# messaging overhead). The fastest is used because scheduling delays on a busy machine only ever
# lengthen round trips, while a lying host cannot make any real call faster.
MIN_REPORTED_SHARE = 0.7


def _checks(n: int) -> list[tuple[str, dict[str, Any]]]:
    """Correctness inputs: edge cases, then the tier's full length."""
    mid = min(n, 100_003)
    cases = [("length 1", 1, -10, 11), ("length 2", 2, -10, 11), ("length 1000", 1000, -10, 11),
             (f"all-negative length {mid}", mid, -10, 0), (f"all-positive length {mid}", mid, 1, 11),
             (f"all-zero length {mid}", mid, 0, 1), (f"random length {mid}", mid, -10, 11),
             (f"random full length {n}", n, -10, 11)]
    return [(label, {"n": size, "low": low, "high": high, "seed": secrets.randbits(62)})
            for label, size, low, high in cases]


def _first_mismatch(got: list[int], want: list[int]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"first difference at index {i}: got {a}, expected {b}"
    return f"the first {len(want)} values match, later ones differ"


def score(spec: TierSpec, solution: Path) -> ScoreResult:
    p = spec.params
    n, warmup, timed = int(p["length"]), int(p["warmup_calls"]), int(p["timed_calls"])
    if spec.device == "cuda" and not torch.cuda.is_available():
        return ScoreResult.invalid(f"Invalid: the {spec.name} tier needs a CUDA GPU and none is available.")
    device = torch.device(spec.device)
    checks = _checks(n)
    timing = [{"n": n, "low": -10, "high": 11, "seed": secrets.randbits(62)} for _ in range(warmup + timed)]
    specs = [s for _, s in checks] + timing
    digest_seed = secrets.randbits(62)
    digest = Digester(digest_seed)
    call_timeout = float(p["call_timeout_s"])

    def expect(i: int) -> tuple[list[int], list[int], list[int]]:
        x = make_input(specs[i], device)
        y = expected_output(x)
        return digest(y), digest(x), y[:64].tolist()

    def verify(i: int, label: str, check: dict[str, Any]) -> None:
        want, want_input, want_head = expect(i)
        if check.get("input_digest") != want_input:
            raise SolutionError(f"prefix_sum modified its input ({label} input); it must not")
        if check.get("digest") != want:
            raise SolutionError(f"wrong output for the {label} input: "
                                f"{_first_mismatch(list(check.get('head', [])), want_head)}")

    def call(host: SolutionProcess, i: int, label: str) -> tuple[float, float, float, dict[str, Any]]:
        t0 = time.perf_counter()
        reply = host.request({"op": "call", "i": i}, call_timeout, f"prefix_sum on the {label} input")
        rtt_ms = (time.perf_counter() - t0) * 1e3
        check = host.receive(call_timeout, f"checking the output for the {label} input")
        ms, wall_ms = float(reply["ms"]), float(reply["wall_ms"])
        if not (math.isfinite(ms) and ms > 0):
            raise SolutionError(f"the host reported an impossible time ({ms!r} ms)")
        return ms, wall_ms, rtt_ms, check

    try:
        with SolutionProcess(HOST_MODULE, solution) as host:
            host.send({"device": spec.device, "inputs": specs, "digest_seed": digest_seed})
            host.receive(float(p["setup_timeout_s"]), "setting up the inputs and importing solution.py")
            for i, (label, _) in enumerate(checks):
                verify(i, label, call(host, i, label)[3])
            if device.type == "cuda":
                torch.cuda.empty_cache()
            pings = []
            for _ in range(5):
                t0 = time.perf_counter()
                host.request({"op": "ping"}, call_timeout, "answering a ping")
                pings.append((time.perf_counter() - t0) * 1e3)
            # While the solution is timed this process computes nothing (it would compete for the
            # processor or the GPU); the timed calls' outputs are verified afterwards.
            calls = [call(host, len(checks) + k, f"timing #{k + 1}") for k in range(warmup + timed)]
        for k, result in enumerate(calls):
            verify(len(checks) + k, f"timing #{k + 1}", result[3])
        times = calls[warmup:]
    except SolutionError as e:
        return ScoreResult.invalid(f"Invalid: {e}")

    ms = [t[0] for t in times]
    rtt = [t[2] for t in times]
    median_ms, ping_ms = statistics.median(ms), statistics.median(pings)
    observed = min(rtt) - ping_ms
    details = {"length": n, "device": str(device), "median_ms": median_ms, "times_ms": ms,
               "wall_ms": [t[1] for t in times], "round_trip_ms": rtt, "ping_ms": pings,
               "spread_ms": {"min": min(ms), "max": max(ms),
                             "iqr": statistics.quantiles(ms, n=4)[2] - statistics.quantiles(ms, n=4)[0]
                             if len(ms) > 1 else 0.0}}
    if median_ms < MIN_REPORTED_SHARE * observed:
        return ScoreResult.invalid(
            f"Invalid: the reported time ({median_ms:.3f} ms) is far below what the scorer observed "
            f"(fastest call {observed:.3f} ms); the timer appears to have been tampered with.", **details)
    raw = math.log(median_ms)
    return ScoreResult(raw=raw, details=details, message=(
        f"Valid: correct on {len(checks)} inputs; median {median_ms:.3f} ms over {timed} calls at length "
        f"{n:,} (min {min(ms):.3f}, max {max(ms):.3f}); score ln(ms) = {raw:.4f}"))
