"""A machine's first run of a machine-dependent tier, as a newcomer meets it, and what its scores then
read (issue: scores that mean the same on every machine).

    python benchmarks/self_calibration.py [--env optimize_kernel] [--tier mini] [--repeats 5] [--out FILE]

`--out` defaults to benchmarks/results/self_calibration/<today>_<env>_<tier>_<machine>.json (the machine:
the GPU model for a GPU tier, the CPU model for a CPU tier).

In an empty cache (a temporary OPENREBENCH_HOME): the self-calibration a first run makes (timed; made
again with `replace`, so that a record shipped for this machine does not skip it), then `repeats` runs
set up for work, each with its set-up scoring of the start, and `repeats` scorings of the reference:
their normalised scores under this machine's new record, mean and spread (the start's also as the
straight line gives it, not cut at 0 as a normalised score is). The targets: the start
within 0 +/- 0.05 on average, the reference within 1 +/- 0.1, the calibration within 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openrebench.runs import (
    calibrate_machine,
    detect_hardware,
    get_environment,
    install_reference,
    score_run,
    start_run,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="optimize_kernel")
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    console = Console(stderr=True)
    env = get_environment(args.env)
    if not env.tier(args.tier).machine_dependent:
        raise SystemExit(f"{args.env} ({args.tier}) is not machine-dependent: it never calibrates itself")
    if args.out is None:
        model = detect_hardware().key(env.tier(args.tier).device).partition(":")[2]
        machine = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")
        args.out = (Path(__file__).parent / "results" / "self_calibration"
                    / f"{date.today().isoformat()}_{args.env}_{args.tier}_{machine}.json")
    with tempfile.TemporaryDirectory(prefix="self-calibration-") as tmp:
        os.environ["OPENREBENCH_HOME"] = str(Path(tmp) / "home")
        os.environ["OPENREBENCH_SELF_CALIBRATION"] = "1"
        t0 = time.monotonic()
        record = calibrate_machine(env, args.tier, replace=True)
        calibration_s = time.monotonic() - t0
        if record is None:
            raise SystemExit("the calibration was disturbed twice and kept nothing: run it on a quiet "
                             "machine")
        console.print(f"calibrated in {calibration_s:.0f} s: start {record.start.median:.4f} "
                      f"(sd {record.start.sd:.4f}), reference {record.reference.median:.4f}")
        start: list[float] = []
        reference: list[float] = []
        raws: dict[str, list[float]] = {"start": [], "reference": []}
        recalibrated = 0
        for i in range(args.repeats):
            run, row = start_run(env, args.tier, Path(tmp) / f"start{i}")
            assert row is not None and row.normalised is not None, row
            recalibrated += sum(1 for r in run.rows()[0] if r.kind == "setup") - 1
            start.append(row.normalised)
            raws["start"].append(row.raw)
            console.print(f"start #{i + 1}: normalised {row.normalised:.3f}")
        ref_run, _ = start_run(env, args.tier, Path(tmp) / "reference", score_start=False)
        install_reference(ref_run)
        for i in range(args.repeats):
            row = score_run(ref_run, kind="calibration", charged=False)
            assert row.normalised is not None, row.message
            reference.append(row.normalised)
            raws["reference"].append(row.raw)
            console.print(f"reference #{i + 1}: normalised {row.normalised:.3f}")

    span = record.reference.median - record.start.median
    linear = {k: [(r - record.start.median) / span for r in v] for k, v in raws.items()}  # not cut at 0

    def summary(values: list[float]) -> dict[str, float]:
        return {"mean": statistics.fmean(values), "sd": statistics.stdev(values), "min": min(values),
                "max": max(values)}

    result = {"command": " ".join(["python", *sys.argv]), "env": args.env, "tier": args.tier,
              "hardware": detect_hardware().model_dump(), "fingerprint": record.fingerprint,
              "calibration_s": round(calibration_s, 1),
              "record": {"start": record.start.model_dump(), "reference": record.reference.model_dump()},
              "start_normalised": summary(start), "reference_normalised": summary(reference),
              "start_unclipped": summary(linear["start"]),
              "reference_unclipped": summary(linear["reference"]),
              "start_values": start, "reference_values": reference, "raw": raws,
              "recalibrated_at_set_up": recalibrated}
    table = Table(title=f"{args.env} ({args.tier}): a first run on this machine, then its scores")
    for col in ("", "mean", "sd", "min", "max", "target"):
        table.add_column(col)
    for name, s, target in (("start, normalised", result["start_normalised"], "0 ± 0.05"),
                            ("start, not cut at 0", result["start_unclipped"], "0 ± 0.05"),
                            ("reference, normalised", result["reference_normalised"], "1 ± 0.1")):
        table.add_row(name, *(f"{s[k]:.3f}" for k in ("mean", "sd", "min", "max")), target)
    Console().print(table)
    Console().print(f"self-calibration: {calibration_s:.0f} s (target at most 120 s); set-ups that "
                    f"calibrated again: {recalibrated}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
