"""Sandbox start-up latency and per-score overhead of the Inspect harness.

- start-up: `true` run through the bubblewrap sandbox (OpenRebenchSandbox.exec), against the same
  command run directly;
- sandbox creation: a sandbox over an existing run made and closed (harness folder, cgroup, socket);
- per-score overhead: `score_run` with the scorer in a plain process (PID namespace), with the scorer
  in its own bubblewrap sandbox, and the `score` command inside the agent's sandbox (socket round
  trip to the harness, the sandboxed scorer, the log row), on a solution that the scorer rejects at
  import (so the differences are the harness's, not the solution's).

    .venv/bin/python benchmarks/sandbox_overhead.py --repeats 20 \
        --out benchmarks/results/sandbox_overhead.json
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

from openrebench.core import detect_hardware, score_run, start_run
from openrebench.harness import OpenRebenchSandbox, SandboxConfig


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


async def measure(repeats: int, tmp: Path) -> dict[str, list[float]]:
    run, _ = start_run("optimize_kernel", "mini", tmp / "run", score_start=False)
    (run.workspace / "solution.py").write_text("raise SystemExit('rejected at import')\n")
    box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel"))
    times: dict[str, list[float]] = {"direct_true": [], "sandbox_true": [], "create_close": [],
                                     "direct_score": [], "sandboxed_score": [], "sandbox_score": []}
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(["true"], check=True)
            times["direct_true"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert (await box.exec(["true"])).success
            times["sandbox_true"].append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            other = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel"))
            await other.close()
            times["create_close"].append(time.perf_counter() - t0)
        for _ in range(repeats):
            for key, sandboxed in (("direct_score", False), ("sandboxed_score", True)):
                t0 = time.perf_counter()
                row = score_run(run, sandboxed=sandboxed)
                times[key].append(time.perf_counter() - t0)
                assert row.raw is None and "rejected at import" in row.message, row.message
            t0 = time.perf_counter()
            result = await box.exec(["score"], timeout=300)
            times["sandbox_score"].append(time.perf_counter() - t0)
            assert "rejected at import" in result.stdout, result.stdout + result.stderr
    finally:
        await box.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = asyncio.run(measure(args.repeats, Path(tmp)))
    med = {k: median_ms(v) for k, v in times.items()}
    print(f"{'':<34}{'median ms':>12}")
    print(f"{'process start, direct (true)':<34}{med['direct_true']:>12.1f}")
    print(f"{'process start, in sandbox (true)':<34}{med['sandbox_true']:>12.1f}")
    print(f"{'sandbox start-up overhead':<34}{med['sandbox_true'] - med['direct_true']:>12.1f}")
    print(f"{'sandbox creation + close':<34}{med['create_close']:>12.1f}")
    print(f"{'score_run, scorer in a process':<34}{med['direct_score']:>12.1f}")
    print(f"{'score_run, scorer in a sandbox':<34}{med['sandboxed_score']:>12.1f}")
    print(f"{'score command, in agent sandbox':<34}{med['sandbox_score']:>12.1f}")
    print(f"{'scoring sandbox overhead':<34}{med['sandboxed_score'] - med['direct_score']:>12.1f}")
    print(f"{'per-score overhead (all)':<34}{med['sandbox_score'] - med['direct_score']:>12.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "repeats": args.repeats,
                                    "hardware": detect_hardware().model_dump(), "median_ms": med,
                                    "seconds": times}, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
