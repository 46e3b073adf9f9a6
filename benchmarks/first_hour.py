"""A newcomer's first hour, timed by phase: `make demo` from a fresh clone with an empty cache (cold),
`make demo` again (warm), and `make test` in a second fresh clone.

Cold demo: `make install` (the virtual environment and the package) timed alone, then `make demo`, with
OPENREBENCH_HOME an empty folder, so every asset is built. Per environment the script reports what its
assets took to build (each asset's manifest records its build seconds), what its scorings took (the
score log's durations: the set-up scoring of the start, then the oracle's) and the whole task's time
from its Inspect log, and every row's raw and normalised score (the oracle's should read about 1); then
the react attempt on the offline model. Warm demo: the same `make demo`
again, the cache kept. The machine is described (CPU model, cores, memory) beside the numbers.

    .venv/bin/python benchmarks/first_hour.py --out benchmarks/results/first_hour/$(date +%F)_<machine>.json
    .venv/bin/python benchmarks/first_hour.py --skip-test --out /tmp/demo_only.json   # the demos alone

Each phase takes as long as it takes (the targets: cold demo 15 minutes, warm 5, test 10, on 2 cores);
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
# Words of an asset's name (its manifest's `what`) that say whose it is; the rest are shared.
OWNERS = (("chatrl", "chat_rl"), ("fixemb", "fix_embedding"), ("finetune", "optimize_finetune"),
          ("rmlm", "restricted_mlm"), ("rcc", "rust_codecontests"), ("scaling", "scaling_law"),
          ("kernel", "optimize_kernel"))


def timed(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, int]:
    """Run `command`, its output into `log`; its wall seconds and exit code."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return time.monotonic() - started, code


def clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
    return into


def asset_seconds(home: Path) -> dict[str, float]:
    """Build seconds per asset folder, from the manifests under the cache."""
    out = {}
    for manifest in sorted(home.rglob("manifest.json")):
        try:
            data = json.loads(manifest.read_text())
            out[str(data.get("what") or manifest.parent.name)] = float(data["build_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def scoring_seconds(runs: Path, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, dict[str, float]]:
    """Seconds of scoring per environment and kind (set-up, the agent's scorings), from the score logs of
    the runs not named in `skip` (an earlier phase's, in the same folder)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for log in runs.rglob("score_log.jsonl"):
        if log.parent.name in skip:
            continue
        info = json.loads((log.parent / "run.json").read_text())
        for line in log.read_text().splitlines():
            row = json.loads(line)
            out[info["env_id"]][row["kind"]] += float(row.get("duration_s") or 0.0)
    return {env: dict(kinds) for env, kinds in out.items()}


def scores(runs: Path, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, list[dict[str, Any]]]:
    """Each environment's rows (kind, raw, normalised), in order, from the score logs of the runs not named
    in `skip`: the oracle's should read about 1, and the clone is removed after the run."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for log in sorted(runs.rglob("score_log.jsonl")):
        if log.parent.name in skip:
            continue
        info = json.loads((log.parent / "run.json").read_text())
        for line in log.read_text().splitlines():
            row = json.loads(line)
            out[info["env_id"]].append({k: row.get(k) for k in ("kind", "raw", "normalised")})
    return dict(out)


def task_seconds(logs: Path, python: Path,
                 skip: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
    """Each Inspect task's wall time and agent, read with the clone's own Inspect, but for the logs named
    in `skip` (an earlier phase's)."""
    code = (
        "import json, sys\n"
        "from datetime import datetime\n"
        "from inspect_ai.log import list_eval_logs, read_eval_log\n"
        "out = []\n"
        "skip = set(json.loads(sys.argv[2]))\n"
        "for info in list_eval_logs(sys.argv[1]):\n"
        "    if info.name.rsplit('/', 1)[-1] in skip:\n"
        "        continue\n"
        "    log = read_eval_log(info, header_only=True)\n"
        "    s = log.stats\n"
        "    began, done = datetime.fromisoformat(s.started_at), datetime.fromisoformat(s.completed_at)\n"
        "    wall = (done - began).total_seconds()\n"
        "    out.append({'env': log.eval.metadata.get('env_id'), 'agent': log.eval.metadata.get('agent'),\n"
        "                'seconds': wall})\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([str(python), "-c", code, str(logs), json.dumps(sorted(skip))], capture_output=True,
                          text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else []


def env_of(asset: str) -> str:
    return next((env for word, env in OWNERS if word in asset), "shared (corpus, tokenizer)")


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "src"))
    try:
        from openrebench.runs import detect_hardware

        return detect_hardware().model_dump()
    except Exception as e:  # the describing is a nicety; the timings stand without it
        return {"error": f"{type(e).__name__}: {e}", "cpus": os.cpu_count()}


def demo_phases(work: Path, home: Path, env: dict[str, str], label: str) -> dict[str, Any]:
    """One `make demo`, its scorings and tasks counted from the runs and logs it made (a warm demo's
    folders also hold the cold one's)."""
    runs, logs = work / "runs" / "demo", work / "logs" / "demo"
    before = {p.name for folder in (runs, logs) if folder.is_dir() for p in folder.iterdir()}
    seconds, code = timed(["make", "demo"], work, env, work.parent / f"{label}.log")
    return {"seconds": round(seconds, 1), "exit_code": code, "log": str(work.parent / f"{label}.log"),
            "assets_s": asset_seconds(home), "scorings_s": scoring_seconds(runs, before),
            "scores": scores(runs, before),
            "tasks": task_seconds(logs, work / ".venv" / "bin" / "python", before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-test", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the clones (their logs, runs, caches)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "machine": machine(),
                              "measured_at": datetime.now().isoformat(timespec="seconds"),
                              "commit": commit.stdout.strip()}
    tmp = Path(tempfile.mkdtemp(prefix="first-hour-"))
    tmp.chmod(0o755)  # the sandboxes' unprivileged uids must reach the clones' Python (see `make reach`)
    console = Console()

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")

    if not args.skip_demo:
        work, home = clone(tmp / "demo"), tmp / "home"
        env = {**os.environ, "OPENREBENCH_HOME": str(home)}
        env.pop("OPENREBENCH_MODELS", None)
        install, code = timed(["make", "install"], work, env, tmp / "install.log")
        record["install"] = {"seconds": round(install, 1), "exit_code": code}
        console.print(f"install: {install:.0f} s")
        save()
        record["cold_demo"] = demo_phases(work, home, env, "cold-demo")
        console.print(f"cold demo: {record['cold_demo']['seconds']:.0f} s (+ install {install:.0f} s)")
        save()
        record["warm_demo"] = demo_phases(work, home, env, "warm-demo")
        console.print(f"warm demo: {record['warm_demo']['seconds']:.0f} s")
        save()
    if not args.skip_test:
        work = clone(tmp / "test")
        seconds, code = timed(["make", "test"], work, {**os.environ}, tmp / "test.log")
        tail = (tmp / "test.log").read_text().splitlines()[-3:]
        record["test"] = {"seconds": round(seconds, 1), "exit_code": code, "tail": tail}
        console.print(f"make test: {seconds:.0f} s, exit {code}")
        save()
    table = Table(title="the first hour, by phase (seconds)")
    for column in ("phase", "cold", "warm"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    if "cold_demo" in record:
        cold, warm = record["cold_demo"], record["warm_demo"]
        table.add_row("install", f"{record['install']['seconds']:.0f}", "")
        builds: dict[str, float] = defaultdict(float)
        for asset, s in cold["assets_s"].items():
            builds[env_of(asset)] += s
        for env_id, s in sorted(builds.items()):
            table.add_row(f"asset builds: {env_id}", f"{s:.0f}", "")
        for env_id in sorted(set(cold["scorings_s"]) | set(warm["scorings_s"])):
            c, w = cold["scorings_s"].get(env_id, {}), warm["scorings_s"].get(env_id, {})
            table.add_row(f"scorings: {env_id}", f"{sum(c.values()):.0f}", f"{sum(w.values()):.0f}")
        for c, w in zip(cold["tasks"], warm["tasks"], strict=False):
            table.add_row(f"task: {c['env']} ({c['agent']})", f"{c['seconds']:.0f}", f"{w['seconds']:.0f}")
        table.add_row("make demo (whole)", f"{cold['seconds']:.0f}", f"{warm['seconds']:.0f}")
    if "test" in record:
        table.add_row("make test (fresh clone, install included)", f"{record['test']['seconds']:.0f}", "")
    console.print(table)
    save()
    console.print(f"results: {args.out}" + ("" if args.keep else f" (clones in {tmp} removed)"))
    if not args.keep:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
