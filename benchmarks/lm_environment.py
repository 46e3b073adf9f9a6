"""A language-model environment on this machine: build its assets (timed), then calibrate.

1. Asset build: every asset the tier needs (corpus, trained models, the environment's own), with
   the seconds each took and the losses the builders recorded in their manifests.
2. The real scoring pipeline (what `openrebench calibrate` runs): the starting and the reference
   solutions each scored `--repeats` times.

Prints a table and writes everything as JSON to `--out`, the calibration record included. It writes no
record anywhere else: the one the package ships is written by `openrebench calibrate ENV --tier T
--repeats 2 --ship`.

    python benchmarks/lm_environment.py fix_embedding --tier mini --repeats 2 \
        --out benchmarks/results/lm_environment/$(date +%F)_fix_embedding_mini_xeon.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from openrebench.api import cache_dir
from openrebench.lm import assets_root, load_manifest
from openrebench.runs import calibrate_environment, detect_hardware, get_environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    env = get_environment(args.env_id)
    started = time.monotonic()
    env.build_assets(args.tier, cache_dir())
    build_s = time.monotonic() - started
    assets = {}
    for folder in sorted(assets_root(cache_dir()).iterdir()):
        manifest = load_manifest(folder) if folder.is_dir() else None
        if manifest is not None:
            assets[folder.name] = {"what": manifest.what, "build_seconds": manifest.build_seconds,
                                   "stats": manifest.stats}
    print(f"assets ready in {build_s:.1f} s (this call; builds cached before are reused)")
    for name, info in assets.items():
        losses = {k: round(v, 4) for k, v in info["stats"].items() if k.endswith("loss") and v is not None}
        print(f"  {name:<36} {info['build_seconds']:>8.1f} s  {losses}")
    command = " ".join(["python", *sys.argv])
    record = calibrate_environment(env.id, args.tier, args.repeats, command=command,
                                   on_progress=lambda w, i, raw, msg: print(f"  {w} #{i}: {msg}"))
    print(f"{'':<12}{'n':>4}{'median':>10}{'sd':>10}")
    for which, stats in (("start", record.start), ("reference", record.reference)):
        print(f"{which:<12}{len(stats.values):>4}{stats.median:>10.4f}{stats.sd:>10.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": command, "env_id": env.id, "tier": args.tier, "hardware": detect_hardware().model_dump(),
        "asset_build_seconds_this_call": build_s, "assets": assets,
        "calibration": record.model_dump(mode="json")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
