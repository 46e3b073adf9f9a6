"""`openrebench eval --cluster` on a simulated Ray cluster of three nodes with different fake GPU counts
(Ray's cluster utilities: one raylet per node on this machine, each with its own cache directory).

What runs for real and what is a toy:
- real attempts (the harness's Inspect eval of one sample, its sandbox and scoring, the oracle agent)
  on toy plug-in environments (`cluster_support.py`): the CLI end to end with logs and `analyze`,
  per-node asset preparation, the GPUs the harness leases, a node killed mid-attempt, a driver killed
  mid-run; and one real mini environment (optimize_kernel) with the oracle;
- a toy attempt (`gpu_probe`: start, hold the GPUs a second, end) for GPU exclusivity under load, where
  nine real evals would cost a minute more.

One cluster serves the whole module; the nodes' processes start with as little as Ray allows.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from inspect_ai.log import list_eval_logs, read_eval_log
from typer.testing import CliRunner

from cluster_support import OBJECT_STORE, RAY_ENV, GiB, gpu_probe, write_toy_plugin
from openrebench.api import OpenRebenchError
from openrebench.cli import app
from openrebench.cluster import (
    LOST_FILE,
    QUEUE_FILE,
    START_FILE,
    AttemptQueue,
    AttemptSpec,
    ClusterEval,
    Driver,
    Resources,
    plan_attempts,
)
from openrebench.runs import refresh

TESTS = Path(__file__).parent
NODES = {"head": (4, 0, 32), "n1": (8, 1, 32), "n2": (16, 2, 64)}  # CPUs, GPUs, GiB of memory


@dataclass
class Sim:
    """The simulated cluster: Ray's Cluster, each node's name by node id, and its cache directory."""

    cluster: Any
    root: Path
    plugin: Path
    env: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def node_args(self, name: str) -> dict[str, Any]:
        cpus, gpus, memory = self.shapes[name]
        return {"num_cpus": cpus, "num_gpus": gpus, "memory": memory * GiB,
                "object_store_memory": OBJECT_STORE,
                "env_vars": {**self.env, "OPENREBENCH_HOME": str(self.home(name))}}

    def home(self, name: str) -> Path:
        return self.root / f"home-{name}"

    def add(self, name: str, shape: tuple[int, int, int]) -> None:
        self.shapes[name] = shape
        node = self.cluster.add_node(**self.node_args(name))
        self.names[node.node_id] = name
        self.nodes[name] = node

    def gpus(self, node_id: str) -> int:
        return self.shapes[self.names[node_id]][1]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("cluster")
    plugin = write_toy_plugin(root / "site")
    path = os.pathsep.join(filter(None, [str(TESTS), str(plugin), os.environ.get("PYTHONPATH")]))
    env = {**RAY_ENV, "PYTHONPATH": path, "TOY_BUILD_LOG": str(root / "builds.log"), "TOY_FAKE_GPUS": "1"}
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)  # the head's own processes, started from here
    sys.path.insert(0, str(plugin))
    refresh()
    s = Sim(cluster=None, root=root, plugin=plugin, env=env)
    s.shapes["head"] = NODES["head"]
    head = {**s.node_args("head"), "include_dashboard": False}
    s.cluster = Cluster(initialize_head=True, head_node_args=head)
    s.names[s.cluster.head_node.node_id] = "head"
    for name in ("n1", "n2"):
        s.add(name, NODES[name])
    ray.init(address=s.cluster.address, log_to_driver=False, logging_level="warning")
    try:
        yield s
    finally:
        ray.shutdown()
        s.cluster.shutdown()
        sys.path.remove(str(plugin))
        refresh()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def eval_logs(log_dir: Path) -> list[Any]:
    return [read_eval_log(info) for info in list_eval_logs(str(log_dir))]


def wait_for(what: str, check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_no_gpu_is_ever_held_by_two_attempts_and_every_attempt_runs_once(sim: Sim, tmp_path: Path) -> None:
    """Nine toy attempts asking for 1 or 2 GPUs on a cluster of 3 (nodes of 0, 1 and 2): they queue in
    Ray, and no two that overlap in time ever hold the same GPU of the same node."""
    specs = [AttemptSpec(env_id="toy_gpu", tier="mini", agent="oracle", epoch=e) for e in range(1, 7)]
    specs += [AttemptSpec(env_id="toy_slow", tier="mini", agent="oracle", epoch=e) for e in range(1, 4)]
    asks = {"toy_gpu": 1, "toy_slow": 2}
    plan = ClusterEval(address=sim.cluster.address, specs=specs, log_dir=tmp_path / "logs",
                       runs_dir=tmp_path / "runs", display="none", prepare=False, fresh_worker=False,
                       resources=lambda s: Resources(cpus=1, gpus=asks[s.env_id], memory_bytes=GiB),
                       runner=gpu_probe)
    queue = Driver(plan).run().queue
    attempts = queue.attempts()
    assert [a.state for a in attempts] == ["done"] * 9 and all(a.tries == 1 for a in attempts)
    tries = queue.tries()
    assert len(tries) == 9 and all(t.outcome == "done" for t in tries)
    by_attempt = {a.id: a.spec for a in attempts}
    for t in tries:
        assert len(t.gpus) == asks[by_attempt[t.attempt].env_id], t
        assert all(int(g) < sim.gpus(t.node) for g in t.gpus) and t.node is not None
    for a, b in itertools.combinations(tries, 2):
        overlap = a.started < b.ended and b.started < a.ended  # type: ignore[operator]
        if overlap and a.node == b.node:
            assert not set(a.gpus) & set(b.gpus), (a, b)
    # 3 GPUs for 12 GPU-seconds of work: attempts waited for GPUs rather than sharing them.
    assert sum(t.started - t.submitted > 0.9 for t in tries) >= 3  # type: ignore[operator]
    assert queue.counts() == {"toy_gpu": Counter(done=6), "toy_slow": Counter(done=3)}


def test_an_attempt_no_node_can_hold_is_one_line_on_a_local_cluster(sim: Sim, tmp_path: Path) -> None:
    plan = ClusterEval(address="local", specs=[AttemptSpec(env_id="toy_gpu", tier="mini", agent="oracle")],
                       log_dir=tmp_path / "logs", runs_dir=tmp_path / "runs", display="none",
                       resources=lambda s: Resources(cpus=1, gpus=4, memory_bytes=GiB))
    with pytest.raises(OpenRebenchError, match=r"toy_gpu \(mini\) needs 4 GPU\(s\), 1 CPU\(s\), 1 GiB on "
                                               r"one node; the cluster's nodes have .*2 GPU\(s\), 16 CPU"):
        Driver(plan).run()


def test_eval_on_the_cluster_logs_every_attempt_once_where_analyze_and_inspect_read_them(
        sim: Sim, tmp_path: Path) -> None:
    logs, runs = tmp_path / "logs", tmp_path / "runs"
    result = invoke("eval", "toy_cpu", "toy_gpu", "--epochs", "2", "--cluster", sim.cluster.address,
                    "--log-dir", str(logs), "--runs-dir", str(runs), "--display", "none")
    assert result.exit_code == 0, result.output
    assert "toy_cpu" in result.output and "toy_gpu" in result.output
    found = eval_logs(logs)
    assert len(found) == 4 and all(log.status == "success" for log in found)
    scores = sorted((log.eval.task, log.eval.metadata["cluster"]["epoch"],
                     log.samples[0].scores["run_score"].value) for log in found)
    assert scores == [("toy_cpu", 1, 1.0), ("toy_cpu", 2, 1.0), ("toy_gpu", 1, 1.0), ("toy_gpu", 2, 1.0)]
    analysis = invoke("analyze", str(logs), "--json", "--boots", "10", "--sims", "10")
    assert analysis.exit_code == 0, analysis.output
    assert json.loads(analysis.output)["groups"][0]["runs_by_env"] == {"toy_cpu": 2, "toy_gpu": 2}

    # The harness leased exactly the GPU Ray gave the attempt, and the process saw only that one.
    queue = AttemptQueue(logs / QUEUE_FILE)
    for attempt in queue.attempts():
        (t,) = queue.tries(attempt.id)
        assert attempt.run_dir and Path(attempt.run_dir).parent == Path(t.dir)
        if attempt.spec.env_id == "toy_gpu":
            leased, visible = (Path(attempt.run_dir) / "protected" / "gpus.txt").read_text().split()
            assert [leased] == t.gpus and visible == leased and sim.gpus(t.node) > 0  # type: ignore[arg-type]
    queue.close()

    # Assets are built once per node, only on nodes that can run the tier, before or by its first attempt.
    builds = Counter(tuple(line.split()[:2]) for line in (sim.root / "builds.log").read_text().splitlines())
    assert all(n == 1 for n in builds.values()), builds
    homes = {env: {h for h, e in builds if e == env} for env in ("toy_cpu", "toy_gpu")}
    assert homes["toy_cpu"] == {str(sim.home(n)) for n in ("head", "n1", "n2")}
    assert homes["toy_gpu"] == {str(sim.home(n)) for n in ("n1", "n2")}
    for name in ("head", "n1", "n2"):
        assert (sim.home(name) / "cluster" / "toy_cpu--mini.prepared.jsonl").exists()


def test_a_node_killed_mid_attempt_is_retried_on_another_node_and_its_partial_run_kept(
        sim: Sim, tmp_path: Path) -> None:
    specs = plan_attempts(["toy_slow"], tier="mini", agent="oracle", model=None, epochs=1)
    plan = ClusterEval(address=sim.cluster.address, specs=specs, log_dir=tmp_path / "logs",
                       runs_dir=tmp_path / "runs", display="none")
    driver = threading.Thread(target=lambda: Driver(plan).run(), daemon=True)
    driver.start()
    try1 = tmp_path / "runs" / specs[0].id / "try1"
    start = wait_for("the first try to start", lambda: json.loads((try1 / START_FILE).read_text())
                     if (try1 / START_FILE).exists() else None)
    wait_for("its set-up to be under way", lambda: list(try1.glob(".*setting-up*")))
    name = sim.names[start["node"]]
    sim.cluster.remove_node(sim.nodes.pop(name))
    sim.add(f"{name}-again", sim.shapes[name])  # the cluster's size again, for the tests after this one
    driver.join(timeout=180)
    assert not driver.is_alive()
    queue = AttemptQueue(tmp_path / "logs" / QUEUE_FILE)
    (attempt,) = queue.attempts()
    assert attempt.state == "done" and attempt.tries == 2 and attempt.score == 1.0
    first, second = queue.tries(attempt.id)
    assert first.outcome == "lost" and "node" in (first.reason or "") and first.node == start["node"]
    assert second.outcome == "done" and second.node != first.node
    lost = json.loads((try1 / LOST_FILE).read_text())
    assert lost["retried"] is True and lost["start"]["node"] == start["node"]
    assert list(try1.glob(".*setting-up*")), "the partial run is kept for inspection"
    (log,) = eval_logs(tmp_path / "logs")
    assert log.status == "success" and log.eval.metadata["cluster"]["try"] == 2


def test_a_driver_killed_mid_run_resumes_with_nothing_lost_or_run_twice(sim: Sim, tmp_path: Path) -> None:
    logs, runs = tmp_path / "logs", tmp_path / "runs"
    args = ["eval", "toy_cpu", "toy_slow", "--cluster", sim.cluster.address, "--log-dir", str(logs),
            "--runs-dir", str(runs), "--display", "none"]
    env = {**os.environ, **RAY_ENV, "PYTHONPATH": sim.env["PYTHONPATH"]}
    exe = Path(sys.executable).parent / "openrebench"
    driver = subprocess.Popen([str(exe), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def states() -> dict[str, str] | None:
            if not (logs / QUEUE_FILE).exists():
                return None
            try:
                queue = AttemptQueue(logs / QUEUE_FILE)
                found = {a.spec.env_id: a.state for a in queue.attempts()}
                queue.close()
            except Exception:  # the driver is writing
                return None
            return found if found.get("toy_cpu") == "done" and found.get("toy_slow") == "running" else None

        wait_for("one attempt done and the other running", states, timeout=150)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    (first_log,) = list_eval_logs(str(logs))
    mtime = os.stat(first_log.name.removeprefix("file://")).st_mtime

    refused = invoke(*args)
    assert refused.exit_code == 1 and "pass --resume" in refused.output

    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    queue = AttemptQueue(logs / QUEUE_FILE)
    attempts = {a.spec.env_id: a for a in queue.attempts()}
    assert attempts["toy_cpu"].tries == 1 and attempts["toy_slow"].tries == 2
    first, second = queue.tries(attempts["toy_slow"].id)
    assert first.outcome == "interrupted" and second.outcome == "done"
    assert json.loads((Path(first.dir) / LOST_FILE).read_text())["reason"].startswith("the driver stopped")
    found = eval_logs(logs)
    assert sorted(log.eval.task for log in found) == ["toy_cpu", "toy_slow"]
    assert all(log.status == "success" and log.samples[0].scores["run_score"].value == 1.0 for log in found)
    assert {a.log for a in attempts.values()} == {log.location.removeprefix("file://") for log in found}
    assert os.stat(first_log.name.removeprefix("file://")).st_mtime == mtime  # the done attempt untouched
    queue.close()


@pytest.mark.slow
def test_a_real_mini_environment_runs_with_the_oracle_on_the_cluster(sim: Sim, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = invoke("eval", "optimize_kernel", "--cluster", sim.cluster.address, "--log-dir", str(logs),
                    "--runs-dir", str(tmp_path / "runs"), "--display", "none")
    assert result.exit_code == 0, result.output
    (log,) = eval_logs(logs)
    score = log.samples[0].scores["run_score"]
    assert log.status == "success" and score.value > 0.5, score
    assert Path(score.metadata["run_dir"]).is_relative_to(tmp_path / "runs")
