"""The harness's own cost per `score`: what a scoring costs beyond the scorer's work.

Measured on scaling_law (mini), whose scorer reads one JSON answer and imports no torch, so the
scorer's own time is small and steady and the differences below are the harness's. Each repeat runs,
interleaved:
- bare: the scorer process alone on a ready snapshot (`python -P -m openrebench.runs._scorer_main`,
  no sandbox, no snapshot, no log);
- score_run: the harness's scoring path (snapshot, scoring sandbox with its cgroup, the scorer, the
  row appended to the score log);
- score command: `score` typed in the agent's bubblewrap sandbox (the client, the Unix socket, the
  scoring path, the answer).
It reports medians and the medians of the paired differences (score command - bare is the harness's
overhead per `score`), the freeze and thaw of the agent's cgroup that timing environments add, and
the start-up of a command in the agent's sandbox.

    .venv/bin/python benchmarks/sandbox_overhead.py --out benchmarks/results/sandbox_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.runs import detect_hardware, score_run, snapshot_workspace, start_run

ENV = "scaling_law"


def _bare(snapshot: Path, protected: Path) -> float:
    config = {"env_id": ENV, "tier": "mini", "nonce": "0", "solution": str(snapshot),
              "protected": str(protected)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-P", "-m", "openrebench.runs._scorer_main"], cwd=snapshot,
                         input=json.dumps(config).encode(), capture_output=True, check=True)
    elapsed = time.perf_counter() - t0
    assert b"Valid" in out.stdout, out.stdout[-400:]
    return elapsed


async def measure(repeats: int, tmp: Path) -> dict[str, list[float]]:
    run, _ = start_run(ENV, "mini", tmp / "run", score_start=False)
    snapshot = tmp / "snapshot"
    snapshot_workspace(run.workspace, snapshot)
    box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id=ENV))
    times: dict[str, list[float]] = {k: [] for k in (
        "bare", "score_run", "score_command", "snapshot", "freeze_thaw", "direct_true", "sandbox_true")}
    try:
        await box.exec(["score"], timeout=300)  # warm caches once
        for _ in range(repeats):
            times["bare"].append(_bare(snapshot, run.protected))
            t0 = time.perf_counter()
            row = score_run(run, sandboxed=True)
            times["score_run"].append(time.perf_counter() - t0)
            assert row.raw is not None, row.message
            t0 = time.perf_counter()
            result = await box.exec(["score"], timeout=300)
            times["score_command"].append(time.perf_counter() - t0)
            assert "Valid" in result.stdout, result.stdout + result.stderr
            with tempfile.TemporaryDirectory() as snap:
                t0 = time.perf_counter()
                snapshot_workspace(run.workspace, Path(snap) / "s")
                times["snapshot"].append(time.perf_counter() - t0)
            if box.cgroup is not None and getattr(box.cgroup, "can_freeze", False):
                t0 = time.perf_counter()
                box.cgroup.freeze()
                box.cgroup.thaw()
                times["freeze_thaw"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(["true"], check=True)
            times["direct_true"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert (await box.exec(["true"])).success
            times["sandbox_true"].append(time.perf_counter() - t0)
    finally:
        await box.close()
    return times


def paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = asyncio.run(measure(args.repeats, Path(tmp)))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
    diffs = {"harness_overhead_per_score": paired(times["score_command"], times["bare"]),
             "scoring_path_overhead": paired(times["score_run"], times["bare"]),
             "socket_and_client": paired(times["score_command"], times["score_run"]),
             "sandbox_startup": paired(times["sandbox_true"], times["direct_true"])}
    table = Table(title=f"harness overhead per score ({ENV} mini, {args.repeats} interleaved repeats)")
    table.add_column("measure")
    table.add_column("median ms", justify="right")
    for key, value in [*med.items(), *diffs.items()]:
        table.add_row(key.replace("_", " "), f"{value:.1f}")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]), "repeats": args.repeats, "environment": ENV,
        "hardware": detect_hardware().model_dump(), "median_ms": med, "paired_difference_ms": diffs,
        "seconds": times}, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
