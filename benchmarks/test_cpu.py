"""Where `make test`'s parallel pass spends the machine's CPU, test by test, subprocesses included.

The suite is CPU-bound on two cores (both busy 98% of the pass), so its wall time is the CPU its tests
use, not their waits; and most of that CPU is in child processes (scorings in sandboxes, model servers,
Ray workers) that a test's own timings do not see. This runs the pass as `make test` does (`-n 2
--dist worksteal -m "not timing"`, or the pytest arguments given after `--`) under the kernel's process
accounting (BSD `acct`: needs root and `accton`, Debian's `acct` package), then charges each process's CPU
to the test its xdist worker was running when the process ran, following parent links up to the worker;
a process whose parents are gone (reparented daemons, sandboxes' inner processes) is shared among the
tests running at its midpoint. A worker's own CPU (what tests do in its process: the gateway and its
in-process judge among them) is known only in total, and is shared among its tests by their wall time, so
a test that works mostly in-process is under- or over-charged. Prints the tests and files that cost most
and writes every test's CPU as JSON.

    .venv/bin/python benchmarks/test_cpu.py --out benchmarks/results/test_cpu/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "openrebench_test_cpu_plugin"
PLUGIN_SOURCE = '''
import json, os, time
import pytest

_rows = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.time()
    yield
    _rows.append({"id": item.nodeid, "pid": os.getpid(), "start": started, "end": time.time()})


def pytest_sessionfinish(session):
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(os.environ["OPENREBENCH_TEST_CPU_DIR"], f"tests-{name}.json"), "w") as f:
        json.dump(_rows, f)
'''


def _processes(accounting: Path) -> list[dict[str, Any]]:
    """Every process the accounting file recorded: its command, CPU seconds, pid, parent, start, length."""
    out = subprocess.run(["dump-acct", str(accounting)], capture_output=True, text=True, check=True).stdout
    hz = 100.0  # acct v3 counts in AHZ ticks
    procs = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15 or f[1] != "v3":
            continue
        began = datetime.datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").replace(tzinfo=datetime.UTC)
        procs.append({"comm": f[0], "cpu": (float(f[2]) + float(f[3])) / hz, "elapsed": float(f[4]) / hz,
                      "pid": int(f[9]), "ppid": int(f[10]), "began": began.timestamp()})
    return procs


def attribute(procs: list[dict[str, Any]], tests: list[dict[str, Any]]) -> tuple[dict[str, float], float]:
    """CPU seconds by test id, and what ran outside every test (the session's own start and end)."""
    workers = {t["pid"] for t in tests}
    parent = {p["pid"]: p["ppid"] for p in procs}
    by_worker: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for t in tests:
        by_worker[t["pid"]].append(t)

    def worker_of(pid: int) -> int | None:
        for _ in range(64):
            if pid in workers:
                return pid
            if pid not in parent:
                return None
            pid = parent[pid]
        return None

    cpu: dict[str, float] = collections.defaultdict(float)
    outside = 0.0
    for p in procs:
        if p["pid"] in workers:
            continue  # a worker's own CPU is charged below
        middle = p["began"] + p["elapsed"] / 2
        worker = worker_of(p["ppid"])
        candidates = by_worker[worker] if worker is not None else tests
        running = [t["id"] for t in candidates if t["start"] - 1 <= middle <= t["end"] + 1]
        if worker is not None:
            running = running[:1]
        if not running:
            outside += p["cpu"]
        for test in running:
            cpu[test] += p["cpu"] / len(running)
    # A worker's own CPU (the test's in-process work) is known only in total: shared by wall time.
    for worker in workers:
        own = sum(p["cpu"] for p in procs if p["pid"] == worker)
        wall = sum(t["end"] - t["start"] for t in by_worker[worker]) or 1.0
        for t in by_worker[worker]:
            cpu[t["id"]] += own * (t["end"] - t["start"]) / wall
    return dict(cpu), outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: make test's "
                                                       "parallel pass)")
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("accton") or not shutil.which("dump-acct"):
        sys.exit("error: process accounting needs root and the acct tools (apt-get install acct)")
    pytest_args = args.pytest_args or ["-n", "2", "--dist", "worksteal", "-m", "not timing"]
    with tempfile.TemporaryDirectory(prefix="openrebench-test-cpu-") as tmp:
        folder = Path(tmp)
        (folder / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        accounting = folder / "pacct"
        accounting.touch()
        # The plugin's folder alone on the path: an empty entry would put each child's working folder there.
        path = [str(folder), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OPENREBENCH_TEST_CPU_DIR": str(folder)}
        subprocess.run(["accton", str(accounting)], check=True, capture_output=True)
        started = time.monotonic()
        try:
            result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", PLUGIN, *pytest_args],
                                    cwd=ROOT, env=env)
        finally:
            subprocess.run(["accton", "off"], check=False, capture_output=True)
        wall = time.monotonic() - started
        found = sorted(folder.glob("tests-gw*.json")) or sorted(folder.glob("tests-main.json"))
        tests = [t for f in found for t in json.loads(f.read_text())]
        procs = _processes(accounting)
    cpu, outside = attribute(procs, tests)
    files: dict[str, float] = collections.defaultdict(float)
    for test, seconds in cpu.items():
        files[test.split("::")[0]] += seconds
    total = sum(p["cpu"] for p in procs)
    console = Console(width=max(150, shutil.get_terminal_size().columns))  # test ids are long
    for title, rows in (("tests", cpu), ("files", files)):
        table = Table(title=f"CPU seconds by {title[:-1]}, subprocesses included (the {args.top} largest)")
        table.add_column("CPU s", justify="right")
        table.add_column(title[:-1])
        for name, seconds in sorted(rows.items(), key=lambda kv: -kv[1])[:args.top]:
            table.add_row(f"{seconds:.1f}", name)
        console.print(table)
    print(f"pass: {wall:.0f} s wall, {total:.0f} CPU s recorded ({total / wall:.2f} cores busy on average), "
          f"{outside:.0f} CPU s outside any test; pytest exit {result.returncode}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/test_cpu.py" + (" -- " + " ".join(args.pytest_args)
                                                      if args.pytest_args else ""),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip() or None,
        "pytest_args": pytest_args, "exit_code": result.returncode, "wall_s": round(wall, 1),
        "cpu_s": round(total, 1), "outside_tests_s": round(outside, 1), "cpu_count": os.cpu_count(),
        "files": {k: round(v, 2) for k, v in sorted(files.items(), key=lambda kv: -kv[1])},
        "tests": {k: round(v, 2) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
        "wall_by_test": {t["id"]: round(t["end"] - t["start"], 2) for t in tests}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
