"""scaling_law: time the build of a tier's ground truth and record what it found.

The package's commands write what it ships: `openrebench build scaling_law --tier T --ship` the ground
truth (`reference/ground_truth--<tier>.json`, a sweep of widths at the target budget; each point is
cached, so an interrupted build resumes) and `openrebench calibrate scaling_law --tier T --repeats 1
--ship` the calibration record. This benchmark runs the same build (`Environment.build_shipped`) into a
throw-away folder, or into `--keep`, and writes what it measured to `--out` as JSON: the curve, the
optimum, the raw scores of the starting and the reference answers (exact for that ground truth), and
the seconds of the sweep and of the reference procedure. After a build it reuses every cached point.

    python benchmarks/scaling_law_sweep.py --tier mini \\
        --out benchmarks/results/scaling_law_sweep/$(date +%F)_mini_xeon.json
    python benchmarks/scaling_law_sweep.py --tier full --out $OUT/$(date +%F)_full_h200.json \\
        --keep $OUT                                                       # one H200
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from openrebench.api import cache_dir, show_progress
from openrebench.runs import get_environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--out", type=Path, required=True, help="write the summary (JSON) here")
    parser.add_argument("--keep", type=Path, help="keep the built files in this folder (laid out as the "
                                                  "environment's), e.g. on a machine whose checkout does "
                                                  "not come back")
    args = parser.parse_args()
    env = get_environment("scaling_law")
    env.tier(args.tier)
    command = " ".join(["python", *sys.argv])
    with tempfile.TemporaryDirectory(prefix="scaling-law-build-") as tmp:
        folder = args.keep or Path(tmp)
        started = time.monotonic()
        built = env.build_shipped(args.tier, folder, cache_dir(), command=command)
        seconds = time.monotonic() - started
    print("\n".join(built.lines))
    print(f"build: {seconds:.0f} s in this call" + (f"; kept in {args.keep}" if args.keep else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": command, **built.summary, "build_seconds_this_call": seconds},
                                   indent=2) + "\n")


if __name__ == "__main__":
    with show_progress():
        main()
