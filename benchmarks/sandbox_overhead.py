"""The harness's own costs: a command in the attempt's long-lived sandbox, and a `score`.

Commands. Each attempt has one sandbox that every command enters through its exec server. Measured, per
repeat: `true` run through the harness (`OpenRebenchSandbox.exec`: the socket, the fork inside, the
memory files for output, the reply) against `true` run bare inside the same running sandbox (timed by a
loop in there): the difference is what a command costs beyond the exec itself (target: 20 ms median).
Also the sandbox's start and teardown.

Scorings. The scorer's own seconds would drown the harness's, so the scoring is of a no-op environment
(written here as a plug-in package in a temporary folder: its scorer returns at once). Each repeat runs,
interleaved:
- bare: the scorer process alone on a ready snapshot (`python -P -m openrebench.runs._scorer_main`: the
  interpreter, the package, the no-op), no sandbox, no snapshot, no log;
- score command: `score` typed in the agent's sandbox: the client, the socket, the freeze of the agent,
  the snapshot, the scoring sandbox with its cgroup and fresh uid, the scorer, the row, the thaw.
The paired difference is the harness's overhead per `score` (target: 150 ms median).

    .venv/bin/python benchmarks/sandbox_overhead.py \\
        --out benchmarks/results/sandbox_overhead/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.runs import detect_hardware, refresh, snapshot_workspace, start_run

ENV = "noop_bench"
NOOP = '''
from pathlib import Path
from typing import ClassVar

from openrebench.api import Direction, Environment, NormConstants, ScoreResult, TierSpec


class Noop(Environment):
    """Scores at once: for measuring what the harness adds to a scoring."""

    id = "noop_bench"
    rebench_id = "noop_bench"
    title = "No-op (benchmark)"
    version = "0.1.0"
    direction = Direction.MIN
    tiers: ClassVar[dict[str, TierSpec]] = {
        "mini": TierSpec(name="mini", description="instant", device="cpu", hardware="any CPU",
                         time_limit_hours=1, score_timeout_s=60, memory_limit_gb=1,
                         constants=NormConstants(start=1.0, reference=0.0, source="none")),
    }

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        return ScoreResult(raw=0.0, message="Valid: no-op.")
'''
INSIDE = textwrap.dedent("""
    import json, subprocess, time
    times = []
    for _ in range({n}):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))
""")


def install_noop(folder: Path) -> None:
    """The no-op environment as an installed plug-in (a module and its dist-info on sys.path)."""
    (folder / "noop_bench_env.py").write_text(NOOP)
    info = folder / "noop_bench_env-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: noop-bench-env\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[openrebench.environments]\nnoop_bench = noop_bench_env:Noop\n")
    sys.path.insert(0, str(folder))
    refresh()


def _bare(snapshot: Path, protected: Path, folder: Path) -> float:
    config = {"env_id": ENV, "tier": "mini", "nonce": "0", "solution": str(snapshot),
              "protected": str(protected)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-P", "-m", "openrebench.runs._scorer_main"], cwd=snapshot,
                         input=json.dumps(config).encode(), capture_output=True, check=True,
                         env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})
    elapsed = time.perf_counter() - t0
    assert b"Valid" in out.stdout, out.stdout[-400:] + out.stderr[-400:]
    return elapsed


async def measure(repeats: int, tmp: Path) -> dict[str, list[float]]:
    plugin = tmp / "plugin"
    plugin.mkdir()
    install_noop(plugin)
    run, _ = start_run(ENV, "mini", tmp / "run", score_start=False)
    snapshot = tmp / "snapshot"
    snapshot_workspace(run.workspace, snapshot)
    times: dict[str, list[float]] = {k: [] for k in (
        "bare_scorer", "score_command", "harness_true", "bare_true_inside", "sandbox_start", "sandbox_stop")}
    for _ in range(max(3, repeats // 10)):
        t0 = time.perf_counter()
        box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id=ENV))
        times["sandbox_start"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await box.close()
        times["sandbox_stop"].append(time.perf_counter() - t0)
    box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id=ENV))
    try:
        assert "Valid" in (await box.exec(["score"], timeout=120)).stdout  # warm caches once
        inside = await box.exec(["python", "-c", INSIDE.format(n=repeats)], timeout=600)
        times["bare_true_inside"] = json.loads(inside.stdout)
        for _ in range(repeats):
            times["bare_scorer"].append(_bare(snapshot, run.protected, plugin))
            t0 = time.perf_counter()
            result = await box.exec(["score"], timeout=120)
            times["score_command"].append(time.perf_counter() - t0)
            assert "Valid" in result.stdout, result.stdout + result.stderr
            t0 = time.perf_counter()
            assert (await box.exec(["true"])).success
            times["harness_true"].append(time.perf_counter() - t0)
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
        Path(tmp).chmod(0o755)  # the sandboxes' uids read the plug-in's folder
        times = asyncio.run(measure(args.repeats, Path(tmp)))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
    diffs = {"command_overhead": med["harness_true"] - med["bare_true_inside"],
             "harness_overhead_per_score": paired(times["score_command"], times["bare_scorer"])}
    targets = {"command_overhead": 20.0, "harness_overhead_per_score": 150.0}
    table = Table(title=f"harness overheads ({args.repeats} interleaved repeats; medians)")
    for col in ("measure", "ms", "target"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for key, value in [*med.items(), *diffs.items()]:
        target = targets.get(key)
        table.add_row(key.replace("_", " "), f"{value:.1f}", "" if target is None else
                      f"≤ {target:g} {'met' if value <= target else 'MISSED'}")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]), "repeats": args.repeats,
        "hardware": detect_hardware().model_dump(), "median_ms": med, "overhead_ms": diffs,
        "targets_ms": targets, "seconds": times}, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
