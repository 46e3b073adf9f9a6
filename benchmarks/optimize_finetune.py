"""optimize_finetune on this machine: assets, run-to-run noise, calibration, cheats.

1. Assets: the initial model, the records, the tokenizer (seconds, cached after the first call).
2. `--noise`: outside the scorer, on one draw of inputs (seed and records): the starting pipeline
   twice and the reference pipeline twice, then the reference on another draw. L1 distances between
   the weights, as shares of the reference run's own change from the initial weights: run-to-run noise
   of each pipeline, start against reference (what a scoring compares), and a stale result (what
   copying an earlier run gives). The tolerance must sit well above the first and well below the last.
3. Calibration through the real scoring pipeline: the starting and the reference solutions scored
   `--repeats` times each; every scoring also reports its reference run's time and L1 distances.
4. `--cheats`: the known cheats (`_cheats.py`) scored through the real pipeline; each must be invalid.
   With `--budget-s`, a cheat that would end past that many seconds from the start is skipped.

Prints as it goes and rewrites the JSON at `--out` after every step (a run stopped early keeps what it
measured). Times and L1 distances are reported for invalid scorings too, so a tolerance that is too
tight for a machine shows by how much.

The calibration record goes into the JSON only; the one the package ships is written by
`openrebench calibrate optimize_finetune --tier T --ship`.

    .venv/bin/python benchmarks/optimize_finetune.py --tier mini --repeats 5 --noise --cheats \\
        --out benchmarks/results/optimize_finetune/$(date +%F)_mini_xeon.json
    python benchmarks/optimize_finetune.py --tier full --repeats 1 --cheats --budget-s 370 \\
        --out benchmarks/results/optimize_finetune/$(date +%F)_full_h200.json
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openrebench.api import OpenRebenchError, cache_dir
from openrebench.environments.optimize_finetune._cheats import install_cheat
from openrebench.environments.optimize_finetune._weights import Weights, distances
from openrebench.environments.optimize_finetune.env import CONFIG, DATA, OUTPUT_DIR, Setup
from openrebench.environments.optimize_finetune.scorer import prepare_inputs, run_pipeline, set_seed
from openrebench.runs import (
    calibrate,
    detect_hardware,
    get_environment,
    install_reference,
    place,
    score_run,
    start_run,
)


class Results:
    def __init__(self, path: Path, **header: Any) -> None:
        self.path, self.data = path, dict(header)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def _pipeline(which: str, env: Any, tier: str, protected: Path, seed: int, records: list[str],
              folder: Path, timeout_s: float) -> tuple[Path, float]:
    """One run of the starting or the reference pipeline, as the scorer runs them; (weights, seconds)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if which == "start":  # the pipeline's own files; prepare_inputs adds the inputs
        place([p for p in env.files(tier, cache_dir()).workspace
               if p.dest.split("/")[0] not in ("initial_model", "tokenizer", DATA)], folder)
    else:
        for f in (protected / "reference").iterdir():
            shutil.copyfile(f, folder / f.name)
    config = set_seed((protected / CONFIG).read_text(), seed)
    assert config is not None
    prepare_inputs(folder, protected, seed, records, config, None, link=True)
    outcome = run_pipeline(folder, timeout_s, drop=False, threads=env.tier(tier).params.threads)
    if outcome.exit_code != 0:
        raise RuntimeError(f"the {which} pipeline failed ({outcome.exit_code}):\n{outcome.tail}")
    return folder / OUTPUT_DIR, outcome.seconds


def noise(env: Any, tier: str, protected: Path, work: Path) -> dict[str, Any]:
    spec = env.tier(tier)
    setup = Setup.model_validate_json((protected / "setup.json").read_text())
    pool = (protected / "pool.jsonl").read_text().splitlines(keepends=True)
    draws = [(secrets.randbelow(2**31 - 1), random.Random(secrets.randbits(64)).sample(pool, setup.records))
             for _ in range(2)]
    timeout = float(spec.params.run_timeout_s)
    plan = [("start_a", "start", 0), ("start_b", "start", 0), ("reference_a", "reference", 0),
            ("reference_b", "reference", 0), ("reference_other_draw", "reference", 1)]
    out, seconds = {}, {}
    for name, which, draw in plan:
        out[name], seconds[name] = _pipeline(which, env, tier, protected, *draws[draw], work / name, timeout)
        print(f"  {name}: {seconds[name]:.1f} s")
    initial = Weights(protected / "initial_model")
    pairs = {"start_run_to_run": ("start_a", "start_b"),
             "reference_run_to_run": ("reference_b", "reference_a"),
             "start_vs_reference": ("start_a", "reference_a"),
             "stale_vs_reference": ("reference_other_draw", "reference_a")}
    result: dict[str, Any] = {"seconds": seconds, "seeds": [d[0] for d in draws]}
    for label, (a, b) in pairs.items():
        # relative: L1(a - b) over L1(b - initial), b's own change (the reference run's, but for start_b)
        d = distances(Weights(out[a]), Weights(out[b]), initial)
        result[label] = {"l1": d.agent_reference, "relative": d.relative,
                         "max_abs": d.max_abs_agent_reference, "update_l1": d.reference_initial}
        print(f"  {label:<22} L1 {d.agent_reference:.4g}  ({d.relative:.3e} of the update)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise", action="store_true", help="measure run-to-run noise outside the scorer")
    parser.add_argument("--cheats", action="store_true", help="score the known cheats")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the cheats that would not finish within this many seconds of the start")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    env = get_environment("optimize_finetune")
    command = " ".join(["python", *sys.argv])
    results = Results(args.out, command=command, env_id=env.id, tier=args.tier,
                      hardware=detect_hardware().model_dump())

    started = time.monotonic()
    env.build_assets(args.tier, cache_dir())
    results.put("asset_build_seconds_this_call", time.monotonic() - started)
    print(f"assets ready in {time.monotonic() - started:.1f} s")

    with tempfile.TemporaryDirectory(prefix="optimize-finetune-bench-") as tmp:
        runs = {which: start_run(env.id, args.tier, Path(tmp) / which, score_start=False)[0]
                for which in ("start", "reference")}
        install_reference(runs["reference"])

        if args.noise:
            print("noise: the same inputs run twice by each pipeline, and a different draw")
            results.put("noise", noise(env, args.tier, runs["start"].protected, Path(tmp) / "noise"))

        scorings: list[dict[str, Any]] = []
        for which in ("start", "reference"):
            for i in range(args.repeats):
                row = score_run(runs[which], kind="calibration", charged=False)
                scorings.append({"which": which, "raw": row.raw, "message": row.message,
                                 "duration_s": row.duration_s, "details": row.details})
                results.put("scorings", scorings)
                print(f"  {which} #{i + 1}: {row.message.splitlines()[0]}")
        honest = summarise(scorings)
        queue = {w: [(s["raw"], s["message"]) for s in scorings if s["which"] == w]
                 for w in ("start", "reference")}
        try:
            record = calibrate(env, args.tier, args.repeats, score_once=lambda w: queue[w].pop(0),
                               command=command)
        except OpenRebenchError as e:  # e.g. a tolerance tighter than this machine's noise: see the L1s above
            print(f"no calibration record: {e}")
        else:
            results.put("calibration", record.model_dump(mode="json"))

        if args.cheats:
            cheats: dict[str, Any] = {}
            ref_s = statistics.median([s["details"].get("seconds", 0.0) for s in scorings
                                       if s["which"] == "reference"])
            protected = runs["start"].protected
            earlier_weights = None
            for name in ("initial_weights", "clock", "stale_copy"):
                cost = 3 * ref_s + 40 if name == "stale_copy" else 40  # the others stop before any run
                if args.budget_s and time.monotonic() - started + cost > args.budget_s:
                    cheats[name] = {"skipped": f"about {cost:.0f} s more would pass the {args.budget_s:g} s "
                                               "budget"}
                    print(f"  cheat {name}: skipped ({cheats[name]['skipped']})")
                    continue
                if name == "stale_copy":
                    setup = Setup.model_validate_json((protected / "setup.json").read_text())
                    pool = (protected / "pool.jsonl").read_text().splitlines(keepends=True)
                    earlier_weights, _ = _pipeline("reference", env, args.tier, protected, 12345,
                                                   pool[:setup.records], Path(tmp) / "earlier",
                                                   float(env.tier(args.tier).params.reference_timeout_s))
                run = start_run(env.id, args.tier, Path(tmp) / f"cheat-{name}", score_start=False)[0]
                install_cheat(name, run.workspace, earlier_weights)
                row = score_run(run, kind="calibration", charged=False)
                cheats[name] = {"raw": row.raw, "message": row.message, "duration_s": row.duration_s,
                                "relative_l1": row.details.get("relative_l1")}
                print(f"  cheat {name}: {row.message.splitlines()[0]}")
                results.put("cheats", cheats)
            stale = cheats.get("stale_copy", {}).get("relative_l1")
            if stale is not None and honest is not None:
                tolerance = env.tier(args.tier).params.max_relative_l1
                print(f"relative L1: honest runs up to {honest:.3g}, a stale copy {stale:.3g}; the tolerance "
                      f"({tolerance:g}) should sit well between them")


def summarise(scorings: list[dict[str, Any]]) -> float | None:
    """Print the times (also of invalid scorings) and L1 distances; return the largest honest distance."""
    largest = None
    for which in ("start", "reference"):
        rows = [s["details"] for s in scorings if s["which"] == which]
        secs = [d["seconds"] for d in rows if "seconds" in d]
        relative = [d["relative_l1"] for d in rows if "relative_l1" in d]
        ref_secs = [d["reference_seconds"] for d in rows if "reference_seconds" in d]
        if secs:
            print(f"{which:<10} finetune.sh median {statistics.median(secs):.2f} s (min {min(secs):.2f}, max "
                  f"{max(secs):.2f}); the scorer's reference runs median "
                  f"{statistics.median(ref_secs) if ref_secs else float('nan'):.2f} s")
        if relative:
            print(f"{which:<10} relative L1 to each scoring's reference run: max {max(relative):.3e}")
            largest = max(relative) if largest is None else max(largest, max(relative))
    return largest

if __name__ == "__main__":
    main()
