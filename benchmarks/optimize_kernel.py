"""optimize_kernel: calibrate a tier on this machine and time the kernels directly.

Two measurements, one run:
1. The real scoring pipeline (`openrebench calibrate`): the starting and the reference solutions
   each scored `--repeats` times; mean, median and CV of the raw score ln(ms); the calibration
   record is written to `--record-dir` (the package's calibration folder ships it).
2. A direct timing of both kernels in this process at the tier's length (median of `--calls`
   calls after warm-up; CUDA events on GPU): milliseconds, effective bandwidth for the 8 bytes per
   element that must move (4 read, 4 written), and the speed-up of the reference over the start.

Prints a table and writes everything as JSON to `--out`.

    python benchmarks/optimize_kernel.py --tier full --repeats 10 \
        --out benchmarks/results/optimize_kernel_full_h200.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from openrebench.core import calibrate_environment, detect_hardware, save_record
from openrebench.environments import get_environment
from openrebench.environments.optimize_kernel._inputs import expected_output, make_input


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="mini", choices=["mini", "full"])
    parser.add_argument("--repeats", type=int, default=10, help="scorings of each solution")
    parser.add_argument("--calls", type=int, default=50, help="direct timing calls per kernel")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--record-dir", type=Path, help="also write the calibration record here")
    args = parser.parse_args()

    env = get_environment("optimize_kernel")
    spec = env.tier(args.tier)
    n = int(spec.params["length"])
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("the full tier needs a CUDA GPU")

    direct = {}
    x = make_input({"n": n, "low": -10, "high": 11, "seed": 1234}, device)
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

    def progress(which: str, i: int, raw: float | None, message: str) -> None:
        shown = message if raw is None else f"{raw:.4f} ({math.exp(raw):.3f} ms)"
        print(f"  scoring {which} #{i}: {shown}", flush=True)

    t0 = time.perf_counter()
    record = calibrate_environment("optimize_kernel", args.tier, args.repeats, on_progress=progress,
                                   command=" ".join(["python", *sys.argv]))
    scoring_s = time.perf_counter() - t0
    if args.record_dir:
        print(f"calibration record: {save_record(record, args.record_dir)}")

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

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "optimize_kernel", "tier": args.tier, "length": n, "repeats": args.repeats,
        "command": " ".join(["python", *sys.argv]), "hardware": detect_hardware().model_dump(),
        "direct": direct, "scored": json.loads(record.model_dump_json()), "scored_speedup": ratio,
        "scored_cv_of_ms": ms_cv,
        "scoring_wall_s": scoring_s,
    }, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
