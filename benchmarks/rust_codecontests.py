"""rust_codecontests through the real scoring pipeline: what a scoring costs and what it scores.

Sets up one run per solution (the starting and the reference scaffold), then scores each `--repeats`
times, interleaved, in the scoring sandbox with the tier's task model through the gateway (`--env-model
task_model=...` for another). Per scoring it records the raw score (problems solved), the outcome of
every problem, the seconds spent generating (the scaffold on the held-out problems, in batches) and
judging (rustc and the tests), and the task model's requests, tokens and cost on the scoring's grant.
It prints medians and spreads and writes every scoring to `--out`; with `--record`, also the
calibration record the start's and the reference's scorings make (what `openrebench calibrate
rust_codecontests --ship` would have measured, written there), so that one run both ships and documents.

    .venv/bin/python benchmarks/rust_codecontests.py --tier mini --repeats 2 \\
        --out benchmarks/results/rust_codecontests/$(date +%F)_mini_xeon.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from openrebench.harness import RunModels
from openrebench.runs import Run, detect_hardware, get_environment, install_reference, score_run, start_run


def one_scoring(run: Run, models: RunModels) -> dict[str, Any]:
    t0 = time.monotonic()
    row = score_run(run, kind="calibration", charged=False, access=models.scoring)
    d = row.details
    total = (d.get("models") or {}).get("total") or {}
    return {"raw": row.raw, "message": row.message, "seconds": round(time.monotonic() - t0, 1),
            "generate_s": d.get("generate_s"), "judge_s": d.get("judge_s"), "outcomes": d.get("outcomes"),
            "by_problem": d.get("by_problem"), "requests": total.get("requests"),
            "prompt_tokens": total.get("prompt_tokens"), "completion_tokens": total.get("completion_tokens"),
            "cost_usd": total.get("cost_usd")}


def write_record(env: Any, tier: str, scorings: dict[str, list[dict[str, Any]]], models: dict[str, str],
                 path: Path) -> None:
    """The calibration record these scorings make, as `openrebench calibrate` writes it."""
    from openrebench.runs._calibration import record_of_scorings

    record = record_of_scorings(env, tier, scorings, models=models,
                                command=shlex.join([Path(sys.executable).name, *sys.argv]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=2) + "\n")


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--env-model", action="append", default=[], help="ROLE=MODEL, as for `eval`")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--record", type=Path, help="write the calibration record these scorings make here "
                        "(e.g. src/openrebench/environments/rust_codecontests/calibration/<name>.json)")
    args = parser.parse_args()
    env = get_environment("rust_codecontests")
    overrides = dict(pair.split("=", 1) for pair in args.env_model)
    models = RunModels.for_tier(env, args.tier, overrides)
    assert models is not None
    console = Console()
    scorings: dict[str, list[dict[str, Any]]] = {"start": [], "reference": []}
    with tempfile.TemporaryDirectory(prefix="rcc-bench-") as tmp:
        runs = {}
        for which in scorings:
            runs[which], _ = start_run(env, args.tier, Path(tmp) / which, score_start=False,
                                       access=models.scoring, models=overrides)
            if which == "reference":
                install_reference(runs[which])
        for i in range(args.repeats):
            for which, run in runs.items():
                result = one_scoring(run, models)
                scorings[which].append(result)
                console.print(f"{which} #{i + 1}: raw {result['raw']}, {result['seconds']} s, "
                              f"{result['completion_tokens']} completion tokens", highlight=False)
    table = Table(title=f"rust_codecontests ({args.tier}), task model {models.models['task_model']}")
    for col in ("solution", "n", "raw median", "raw min–max", "seconds (median)", "generate s", "judge s",
                "requests", "tokens in / out", "cost $"):
        table.add_column(col, justify="right")
    summary: dict[str, Any] = {}
    for which, rows in scorings.items():
        valid = [r for r in rows if r["raw"] is not None]
        if not valid:
            table.add_row(which, str(len(rows)), "invalid", *[""] * 7)
            continue
        s = {k: spread([float(r[k] or 0) for r in valid]) for k in
             ("raw", "seconds", "generate_s", "judge_s", "requests", "prompt_tokens", "completion_tokens",
              "cost_usd")}
        summary[which] = s
        table.add_row(which, str(len(valid)), f"{s['raw']['median']:.4f}",
                      f"{s['raw']['min']:.3f}–{s['raw']['max']:.3f}", f"{s['seconds']['median']:.0f}",
                      f"{s['generate_s']['median']:.0f}", f"{s['judge_s']['median']:.1f}",
                      f"{s['requests']['median']:.0f}",
                      f"{s['prompt_tokens']['median']:.0f} / {s['completion_tokens']['median']:.0f}",
                      f"{s['cost_usd']['median']:.4f}")
    console.print(table)
    if args.record is not None:
        write_record(env, args.tier, scorings, overrides, args.record)
        console.print(f"record written to {args.record}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hardware": detect_hardware().model_dump(), "tier": args.tier, "models": models.models,
            "env_version": env.version, "summary": summary, "scorings": scorings}, indent=2) + "\n")
        console.print(f"written to {args.out}")


if __name__ == "__main__":
    main()
