"""What scheduling attempts on Ray costs (`openrebench eval --cluster`), measured on simulated nodes
(Ray's cluster utilities: one raylet per node on this machine, fake GPU counts).

1. Overhead per attempt and throughput against running the same attempts locally, in one run, on a
   cluster of three nodes (0, 1 and 2 GPUs):
   - real toy attempts (the harness's Inspect eval of one sample with the oracle on the toy plug-in
     environment `toy_cpu` of tests/cluster_support.py, each in a fresh worker process, as real
     attempts run) through the driver, against the same attempt function called in this process one
     after another;
   - trivial attempts (`trivial_attempt`: start, write the start marker, end) through the driver, in
     fresh workers and in reused ones, against the same function called locally.
   The overhead is the time from the driver's submission to the attempt's first command (its start
   marker), from the queue's own records, measured one attempt at a time on an idle cluster (all at
   once, an attempt's wait also holds the backlog ahead of it).
2. A scale simulation: one cluster grown to 5, 10 and 20 worker nodes of mixed GPU counts (0, 1, 2,
   4, 8), trivial attempts of mixed GPU asks (0, 1, 1, 1, 2, 4, 8), 250 to 1,000 of them handed to Ray
   at once, each step run by a fresh driver process (so that its memory is its own) after a warm-up
   that starts its workers on every node: scheduling throughput, the wait from submission to start
   (median, 95th percentile: the backlog), the driver's peak memory, the queue's size, and the GCS's
   memory, with lines fitted against attempts to read off a 10,000-attempt eval.

    .venv/bin/python benchmarks/ray_overhead.py --out benchmarks/results/ray_overhead/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster_support import OBJECT_STORE, RAY_ENV, write_toy_plugin  # noqa: E402
from openrebench.cluster import (  # noqa: E402
    QUEUE_FILE,
    AttemptQueue,
    AttemptSpec,
    ClusterEval,
    Driver,
    Resources,
    run_attempt,
    trivial_attempt,
)

GiB = 1024**3
NODE_GPUS = (0, 1, 2, 4, 8)
ASK_GPUS = (0, 1, 1, 1, 2, 4, 8)


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def overheads(log_dir: Path) -> list[float]:
    queue = AttemptQueue(log_dir / QUEUE_FILE)
    out = [t.started - t.submitted for t in queue.tries() if t.started is not None]
    queue.close()
    return out


def trivial_specs(n: int, env_id: str = "optimize_kernel") -> list[AttemptSpec]:
    return [AttemptSpec(env_id=env_id, tier="mini", agent="oracle", epoch=e) for e in range(1, n + 1)]


def driver_run(address: str, specs: list[AttemptSpec], tmp: Path, *, fresh: bool, resources: Any = None,
               runner: Any = trivial_attempt, one_at_a_time: bool = False) -> dict[str, Any]:
    """The driver over these attempts: all handed to Ray at once (throughput; an attempt's wait then
    includes the backlog ahead of it), or one at a time (the overhead of one attempt on an idle cluster)."""
    plan = ClusterEval(address=address, specs=specs, log_dir=tmp / "logs", runs_dir=tmp / "runs",
                       display="none", prepare=runner is run_attempt, fresh_worker=fresh, runner=runner,
                       resources=resources, max_in_flight=1 if one_at_a_time else None)
    t0 = time.perf_counter()
    queue = Driver(plan).run().queue
    wall = time.perf_counter() - t0
    done = len(queue.attempts("done"))
    queue.close()
    over = overheads(tmp / "logs")
    return {"attempts": len(specs), "done": done, "wall_s": wall, "per_s": len(specs) / wall,
            "overhead_median_s": statistics.median(over), "overhead_p95_s": quantile(over, 0.95),
            "overhead_s": over}


def local_run(specs: list[AttemptSpec], tmp: Path, runner: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    for spec in specs:
        folder = tmp / "local" / spec.id
        folder.mkdir(parents=True)
        result = runner(spec.to_json(), str(folder), {"attempt": spec.id, "try": 1, "epoch": spec.epoch})
        assert result["status"] == "done", result
    wall = time.perf_counter() - t0
    return {"attempts": len(specs), "wall_s": wall, "per_s": len(specs) / wall,
            "per_attempt_s": wall / len(specs)}


def part_one(tmp: Path, toy_attempts: int, trivial_fresh: int, trivial_reused: int) -> dict[str, Any]:
    """A 3-node cluster: real toy attempts and trivial ones, through Ray and locally."""
    import ray
    from ray.cluster_utils import Cluster

    from openrebench.runs import refresh

    plugin = write_toy_plugin(tmp / "site")
    sys.path.insert(0, str(plugin))
    refresh()
    os.environ["TOY_BUILD_LOG"] = str(tmp / "builds.log")
    env = {**RAY_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(plugin)]),
           "TOY_BUILD_LOG": str(tmp / "builds.log")}
    nodes = [(4, 0), (8, 1), (16, 2)]

    def args(i: int) -> dict[str, Any]:
        cpus, gpus = nodes[i]
        return {"num_cpus": cpus, "num_gpus": gpus, "memory": 32 * GiB, "object_store_memory": OBJECT_STORE,
                "env_vars": {**env, "OPENREBENCH_HOME": str(tmp / f"home{i}")}}

    cluster = Cluster(initialize_head=True, head_node_args={**args(0), "include_dashboard": False})
    for i in (1, 2):
        cluster.add_node(**args(i))
    ray.init(address=cluster.address, log_to_driver=False, logging_level="warning")
    out: dict[str, Any] = {"nodes": [{"cpus": c, "gpus": g} for c, g in nodes]}
    try:
        toy = [AttemptSpec(env_id="toy_cpu", tier="mini", agent="oracle", epoch=e)
               for e in range(1, toy_attempts + 1)]
        out["toy_ray"] = driver_run(cluster.address, toy, tmp / "toy_ray", fresh=True, runner=run_attempt)
        out["toy_ray_one_at_a_time"] = driver_run(cluster.address, toy[: max(1, toy_attempts // 2)],
                                                  tmp / "toy_alone", fresh=True, runner=run_attempt,
                                                  one_at_a_time=True)
        os.environ["OPENREBENCH_HOME"] = str(tmp / "home-local")
        out["toy_local"] = local_run(toy, tmp / "toy_local", run_attempt)
        small = lambda s: Resources(cpus=1, gpus=0, memory_bytes=GiB)  # noqa: E731
        out["trivial_ray_fresh_one_at_a_time"] = driver_run(
            cluster.address, trivial_specs(trivial_fresh), tmp / "fresh", fresh=True, resources=small,
            one_at_a_time=True)
        out["trivial_ray_reused"] = driver_run(cluster.address, trivial_specs(trivial_reused), tmp / "reused",
                                               fresh=False, resources=small)
        out["trivial_ray_reused_one_at_a_time"] = driver_run(
            cluster.address, trivial_specs(trivial_fresh), tmp / "reused_alone", fresh=False, resources=small,
            one_at_a_time=True)
        out["trivial_local"] = local_run(trivial_specs(trivial_reused), tmp / "trivial_local",
                                         trivial_attempt)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def scale_driver(address: str, attempts: int, folder: Path) -> dict[str, Any]:
    """One scale run in this (fresh) process: the driver's memory sampled while it runs."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="warning")
    asks = {e: ASK_GPUS[(e - 1) % len(ASK_GPUS)] for e in range(1, attempts + 1)}

    def resources(s: AttemptSpec) -> Resources:
        return Resources(cpus=1, gpus=asks[s.epoch], memory_bytes=GiB // 4)

    # Warm-up: this job's worker processes started on every node first (a worker serves one job), so
    # that the measured run times the scheduler, not 40 Python start-ups on one shared machine.
    driver_run(address, trivial_specs(min(attempts, 150)), folder / "warm-up", fresh=False,
               resources=resources)
    me = psutil.Process()
    base = me.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], me.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = driver_run(address, trivial_specs(attempts), folder, fresh=False, resources=resources)
    stop.set()
    sampler.join()
    result |= {"driver_rss_start_mb": base / 2**20, "driver_rss_peak_mb": peak[0] / 2**20,
               "queue_kb": (folder / "logs" / QUEUE_FILE).stat().st_size / 1024}
    result.pop("overhead_s")
    ray.shutdown()
    return result


def gcs_rss_mb() -> float:
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if "gcs_server" in p.name():
                total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def part_two(tmp: Path, steps: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Grow one cluster of fake-GPU nodes; each (nodes, attempts) step run by a fresh driver."""
    from ray.cluster_utils import Cluster

    env = {**RAY_ENV, "PYTHONPATH": str(ROOT / "tests")}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "memory": 4 * GiB, "object_store_memory": OBJECT_STORE,
        "include_dashboard": False, "env_vars": env})
    rows = []
    workers = 0
    try:
        for nodes, attempts in steps:
            while workers < nodes:
                gpus = NODE_GPUS[workers % len(NODE_GPUS)]
                cluster.add_node(num_cpus=2, num_gpus=gpus, memory=16 * GiB, object_store_memory=OBJECT_STORE,
                                 env_vars=env)
                workers += 1
            cluster.wait_for_nodes()
            folder = tmp / f"scale-{nodes}-{attempts}"
            out = subprocess.run([sys.executable, __file__, "--scale-run", cluster.address, str(attempts),
                                  str(folder)], capture_output=True, text=True, timeout=600,
                                 env={**os.environ, **RAY_ENV})
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row |= {"nodes": nodes, "gpus": sum(NODE_GPUS[i % len(NODE_GPUS)] for i in range(nodes)),
                    "gcs_rss_mb": gcs_rss_mb()}
            rows.append(row)
            print(f"  {nodes} nodes, {attempts} attempts: {row['per_s']:.1f}/s, driver peak "
                  f"{row['driver_rss_peak_mb']:.0f} MB", flush=True)
    finally:
        cluster.shutdown()
    return rows


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x (b = 0 from a single point)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    if len(set(xs)) < 2:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--toy-attempts", type=int, default=6)
    parser.add_argument("--trivial-fresh", type=int, default=12)
    parser.add_argument("--trivial-reused", type=int, default=300)
    parser.add_argument("--steps", default="5:250,10:250,20:250,20:500,20:1000",
                        help="nodes:attempts of the scale simulation")
    parser.add_argument("--scale-run", nargs=3, metavar=("ADDRESS", "ATTEMPTS", "FOLDER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_run:
        address, attempts, folder = args.scale_run
        print(json.dumps(scale_driver(address, int(attempts), Path(folder))))
        return
    if args.out is None:
        parser.error("--out is required")
    os.environ.update(RAY_ENV)
    steps = [(int(n), int(a)) for n, a in (s.split(":") for s in args.steps.split(","))]
    console = Console(width=150)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        console.print("part 1: overhead and throughput on 3 simulated nodes")
        one = part_one(Path(tmp) / "one", args.toy_attempts, args.trivial_fresh, args.trivial_reused)
        console.print("part 2: scale simulation")
        two = part_two(Path(tmp) / "two", steps)

    table = Table(title="attempts through Ray against the same attempts run locally (3 simulated nodes)")
    for col in ("attempts", "how", "n", "wall s", "attempts/s", "submit→first command, median s", "p95 s"):
        table.add_column(col, justify="left" if col in ("attempts", "how") else "right")
    toy = "toy Inspect eval (oracle)"
    for key, what, how in (("toy_ray", toy, "Ray, all at once, fresh workers"),
                           ("toy_ray_one_at_a_time", toy, "Ray, one at a time, fresh"),
                           ("toy_local", toy, "locally, one after another"),
                           ("trivial_ray_fresh_one_at_a_time", "trivial", "Ray, one at a time, fresh"),
                           ("trivial_ray_reused_one_at_a_time", "trivial", "Ray, one at a time, reused"),
                           ("trivial_ray_reused", "trivial", "Ray, all at once, reused"),
                           ("trivial_local", "trivial", "locally, one after another")):
        r = one[key]
        med = f"{r['overhead_median_s']:.3f}" if "overhead_median_s" in r else ""
        p95 = f"{r['overhead_p95_s']:.3f}" if "overhead_p95_s" in r else ""
        table.add_row(what, how, str(r["attempts"]), f"{r['wall_s']:.1f}", f"{r['per_s']:.2f}", med, p95)
    console.print(table)

    scale = Table(title="scale simulation: trivial attempts of mixed GPU asks, workers reused")
    for col in ("nodes", "GPUs", "attempts", "wall s", "attempts/s", "overhead median s", "p95 s",
                "driver peak MB", "driver start MB", "queue KB", "GCS MB"):
        scale.add_column(col, justify="right")
    for r in two:
        scale.add_row(str(r["nodes"]), str(r["gpus"]), str(r["attempts"]), f"{r['wall_s']:.1f}",
                      f"{r['per_s']:.1f}", f"{r['overhead_median_s']:.2f}", f"{r['overhead_p95_s']:.2f}",
                      f"{r['driver_rss_peak_mb']:.0f}",
                      f"{r['driver_rss_start_mb']:.0f}", f"{r['queue_kb']:.0f}", f"{r['gcs_rss_mb']:.0f}")
    console.print(scale)
    at_most = [r for r in two if r["nodes"] == max(s[0] for s in steps)]
    a, b = fit([r["attempts"] for r in at_most], [r["driver_rss_peak_mb"] - r["driver_rss_start_mb"]
                                                 for r in at_most])
    qa, qb = fit([r["attempts"] for r in at_most], [r["queue_kb"] for r in at_most])
    rate = statistics.median(r["per_s"] for r in at_most)
    fresh = one["trivial_ray_fresh_one_at_a_time"]["overhead_median_s"]
    projection = {"driver_mb_per_1000_attempts": b * 1000, "driver_mb_at_10000": a + b * 10_000,
                  "queue_mb_at_10000": (qa + qb * 10_000) / 1024, "scheduling_s_for_10000": 10_000 / rate,
                  "fresh_worker_overhead_s": fresh}
    console.print(f"10,000 attempts: the driver grows by about {b * 1000:.1f} MB per 1,000 attempts "
                  f"({a + b * 10_000:.0f} MB over its start at 10,000), the queue file reaches about "
                  f"{projection['queue_mb_at_10000']:.1f} MB, and scheduling them at {rate:.0f} attempts/s "
                  f"takes {10_000 / rate:.0f} s in all; each attempt then starts {fresh:.1f} s (median) "
                  "after its submission in a fresh worker, against 30 minutes to 8 hours of work.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "machine": {"cpus": os.cpu_count(), "memory_gb": psutil.virtual_memory().total / GiB,
                    "note": "every simulated node is a raylet on this one machine; the machine was shared "
                            "with other work while this ran, so times are upper bounds"},
        "ray": __import__("ray").__version__, "wall_s": time.time() - started,
        "overhead_and_throughput": one, "scale": two, "projection_10000": projection}, indent=2) + "\n")
    console.print(f"results: {args.out}")


if __name__ == "__main__":
    main()
