"""optimize_kernel: calibrate a tier on this machine and time the kernels directly.

Three measurements, one run:
1. The real scoring pipeline (what `openrebench calibrate` runs): the starting and the reference
   solutions each scored `--repeats` times; mean, median and CV of the raw score ln(ms). The record
   goes into the JSON only: the one the package ships is written by `openrebench calibrate
   optimize_kernel --tier T --repeats N --ship`.
2. A direct timing of both kernels in this process at the tier's length (median of `--calls`
   calls after warm-up; CUDA events on GPU): milliseconds, effective bandwidth for the 8 bytes per
   element that must move (4 read, 4 written), and the speed-up of the reference over the start.
3. With `--loads 1,2` (CPU tiers): both solutions scored `--load-repeats` times each while that many
   busy-loop processes run alongside: the milliseconds measured, those counted after the tier's
   yardstick adjustment, and the normalised score with the constants this machine uses (its own
   record, else the shipped one, else the tier's defaults), for these scorings and those of step 1.

Prints a table and writes everything as JSON to `--out`.

    python benchmarks/optimize_kernel.py --tier full --repeats 10 \
        --out benchmarks/results/optimize_kernel/$(date +%F)_full_h200.json
    python benchmarks/optimize_kernel.py --tier mini --repeats 5 --loads 1,2 --load-repeats 5 \
        --out benchmarks/results/optimize_kernel/$(date +%F)_mini_xeon.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from openrebench.runs import (
    Run,
    calibrate,
    constants_for,
    detect_hardware,
    get_environment,
    install_reference,
    normalise,
    score_run,
    start_run,
)


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_input(n: int, device: torch.device, seed: int = 1234) -> torch.Tensor:
    """Uniform integers in [-10, 11), int32: the kind of input the scorer times."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-10, 11, (n,), generator=gen, device=device, dtype=torch.int32)


def expected_output(x: torch.Tensor) -> torch.Tensor:
    """Y_i = sum_{j<=i} x_j * [(#k<j with x_k > 0) mod 2], in int64 cast to int32 (the task's definition;
    the scorer checks every solution against its own copy)."""
    odd_before = torch.zeros_like(x, dtype=torch.int64)
    odd_before[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
    return (x.to(torch.int64) * odd_before).cumsum(0).to(torch.int32)


def time_kernel(fn, x: torch.Tensor, calls: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(calls):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """`count` processes spinning in a loop, like other work on a shared machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def scoring(run: Run, which: str, load: int) -> dict[str, Any]:
    """One real scoring; the measured and the counted milliseconds, and the yardstick's times."""
    loadavg = os.getloadavg()[0]
    row = score_run(run, kind="calibration", charged=False)
    d = row.details
    y = d.get("yardstick") or {}
    return {"which": which, "load": load, "raw": row.raw, "message": row.message, "loadavg": loadavg,
            "duration_s": row.duration_s, "median_ms": d.get("median_ms"),
            "adjusted_ms": d.get("adjusted_ms"), "overhead_ms": d.get("overhead_ms"),
            "times_ms": d.get("times_ms"), "yardstick": y or None}


def summarise_loads(scorings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per number of busy processes and solution, over the valid scorings."""
    rows = []
    for busy_count in sorted({s["load"] for s in scorings}):
        for which in ("start", "reference"):
            valid = [s for s in scorings
                     if s["load"] == busy_count and s["which"] == which and s["raw"] is not None]
            if not valid:
                continue
            yard = [s["yardstick"]["ms"] for s in valid if s["yardstick"]]
            rows.append({"load": busy_count, "which": which, "scorings": len(valid),
                         "ms": statistics.median(s["median_ms"] for s in valid),
                         "counted_ms": statistics.median(math.exp(s["raw"]) for s in valid),
                         "yardstick_ms": statistics.median(yard) if yard else None,
                         "normalised": statistics.median(s["normalised"] for s in valid),
                         "normalised_min": min(s["normalised"] for s in valid),
                         "loadavg": statistics.median(s["loadavg"] for s in valid)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="mini", choices=["mini", "full"])
    parser.add_argument("--repeats", type=int, default=10, help="scorings of each solution")
    parser.add_argument("--calls", type=int, default=50, help="direct timing calls per kernel")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--loads", default="", help="busy-loop process counts to score under, e.g. 1,2")
    parser.add_argument("--load-repeats", type=int, default=5, help="scorings of each solution per load")
    args = parser.parse_args()

    env = get_environment("optimize_kernel")
    spec = env.tier(args.tier)
    n = spec.params.length
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("the full tier needs a CUDA GPU")

    direct = {}
    x = make_input(n, device)
    want = expected_output(x)
    for which, folder in (("start", "starting"), ("reference", "reference")):
        fn = load(env.root / folder / "solution.py", f"bench_{which}").prefix_sum
        assert torch.equal(fn(x), want), f"{which} solution is wrong"
        times = time_kernel(fn, x, args.calls)
        median = statistics.median(times)
        direct[which] = {"median_ms": median, "min_ms": min(times), "max_ms": max(times),
                         "cv": statistics.stdev(times) / statistics.fmean(times),
                         "effective_GBps": 8 * n / (median * 1e-3) / 1e9}
    direct["speedup"] = direct["start"]["median_ms"] / direct["reference"]["median_ms"]
    del x, want

    command = " ".join(["python", *sys.argv])
    scorings: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="optimize-kernel-bench-") as tmp:
        runs = {which: start_run(env.id, args.tier, Path(tmp) / which, score_start=False)[0]
                for which in ("start", "reference")}
        install_reference(runs["reference"])

        def score_once(which: str, busy_count: int = 0) -> tuple[float | None, str]:
            s = scoring(runs[which], which, busy_count)
            scorings.append(s)
            shown = s["message"] if s["raw"] is None else f"{s['raw']:.4f} ({math.exp(s['raw']):.3f} ms)"
            print(f"  {busy_count} busy, {which}: {shown}", flush=True)
            return s["raw"], s["message"]

        record = calibrate(env, args.tier, args.repeats, score_once=score_once, command=command)
        scoring_s = time.perf_counter() - t0
        for busy_count in [int(v) for v in args.loads.split(",") if v]:
            with busy(busy_count):
                for _ in range(args.load_repeats):
                    for which in ("start", "reference"):
                        score_once(which, busy_count)
    constants = constants_for(env, args.tier)  # what a run started on this machine normalises with
    for s in scorings:
        s["normalised"] = normalise(s["raw"], constants)

    ratio = math.exp(record.start.median - record.reference.median)
    print(f"\noptimize_kernel, tier {args.tier}, length {n:,}, on {record.hardware_key}")
    print(f"{'':<28}{'start':>12}{'reference':>12}")
    print(f"{'direct median ms':<28}{direct['start']['median_ms']:>12.3f}"
          f"{direct['reference']['median_ms']:>12.3f}")
    print(f"{'direct effective GB/s':<28}{direct['start']['effective_GBps']:>12.1f}"
          f"{direct['reference']['effective_GBps']:>12.1f}")
    print(f"{'scored median ln(ms)':<28}{record.start.median:>12.4f}{record.reference.median:>12.4f}")
    print(f"{'scored median ms':<28}{math.exp(record.start.median):>12.3f}"
          f"{math.exp(record.reference.median):>12.3f}")
    print(f"{'scored CV of ln(ms)':<28}{record.start.cv:>12.2%}{record.reference.cv:>12.2%}")
    ms_cv = {k: statistics.stdev(ms) / statistics.fmean(ms) if len(ms) > 1 else 0.0 for k, ms in
             (("start", [math.exp(v) for v in record.start.values]),
              ("reference", [math.exp(v) for v in record.reference.values]))}
    print(f"{'scored CV of ms':<28}{ms_cv['start']:>12.2%}{ms_cv['reference']:>12.2%}")
    print(f"speed-up of the reference: {ratio:.2f}x scored, {direct['speedup']:.2f}x direct")
    loads = summarise_loads(scorings)
    if any(row["load"] for row in loads):
        print(f"\n{'busy processes':<16}{'solution':<11}{'measured ms':>12}{'counted ms':>12}"
              f"{'yardstick ms':>14}{'normalised':>12}{'load avg':>10}")
        for row in loads:
            print(f"{row['load']:<16}{row['which']:<11}{row['ms']:>12.3f}{row['counted_ms']:>12.3f}"
                  f"{row['yardstick_ms'] or 0:>14.2f}{row['normalised']:>12.3f}{row['loadavg']:>10.2f}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "optimize_kernel", "tier": args.tier, "length": n, "repeats": args.repeats,
        "command": " ".join(["python", *sys.argv]), "hardware": detect_hardware().model_dump(),
        "direct": direct, "scored": json.loads(record.model_dump_json()), "scored_speedup": ratio,
        "scored_cv_of_ms": ms_cv, "scoring_wall_s": scoring_s, "normalisation": constants.model_dump(),
        "by_load": loads, "scorings": scorings,
    }, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
