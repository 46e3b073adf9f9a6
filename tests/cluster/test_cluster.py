"""`openrebench eval --cluster` on a simulated Ray cluster of three nodes with different fake GPU counts
(Ray's cluster utilities: one raylet per node on this machine, each with its own cache directory).

What runs for real and what is a toy:
- real attempts (the harness's Inspect eval of one sample, its sandbox and scoring, the oracle agent)
  on toy plug-in environments (`cluster_support.py`): the CLI end to end with logs and `analyze`,
  per-node asset preparation, the GPUs the harness leases, a node killed mid-attempt, a driver killed
  mid-run; and one real mini environment (optimize_kernel) with the oracle;
- a toy attempt (`gpu_probe`: start, hold the GPUs a second, end) for GPU exclusivity under load, where
  nine real evals would cost a minute more.

One cluster serves the whole module; the nodes' processes start with as little as Ray allows. It runs with
Ray's token authentication, as Ray recommends and docs/cluster.md sets it up: a token made once by
`ray get-auth-token --generate`, RAY_AUTH_MODE=token everywhere, and each node and the driver with its own
copy of the token (a file only its owner reads, named by RAY_AUTH_TOKEN_PATH).
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

from cluster_support import OBJECT_STORE, RAY_AUTH, RAY_ENV, GiB, gpu_probe, write_toy_plugin
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
    forwarded_env,
    plan_attempts,
)
from openrebench.runs import refresh

TESTS = Path(__file__).parents[1]  # tests/: the support modules
NODES = {"head": (4, 0, 32), "n1": (8, 1, 32), "n2": (16, 2, 64)}  # CPUs, GPUs, GiB of memory


@dataclass
class Sim:
    """The simulated cluster: Ray's Cluster, each node's name by node id, its cache directory and its copy
    of the cluster's auth token."""

    cluster: Any
    root: Path
    plugin: Path
    env: dict[str, str]
    token: str
    names: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def node_args(self, name: str) -> dict[str, Any]:
        cpus, gpus, memory = self.shapes[name]
        return {"num_cpus": cpus, "num_gpus": gpus, "memory": memory * GiB,
                "object_store_memory": OBJECT_STORE,
                "env_vars": {**self.env, "OPENREBENCH_HOME": str(self.home(name)),
                             "RAY_AUTH_TOKEN_PATH": str(self.token_file(name))}}

    def home(self, name: str) -> Path:
        return self.root / f"home-{name}"

    def token_file(self, name: str) -> Path:
        """The token as copied onto a node (or the driver): a file only its owner reads."""
        path = self.root / "tokens" / name
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(self.token)
        return path

    def driver_env(self, home: Path, **auth: str) -> dict[str, str]:
        """The environment of a driver in a process of its own: `auth` its only Ray auth variables (none of
        the shell's or this module's), and a home without ~/.ray/auth_token."""
        env = {k: v for k, v in os.environ.items() if k not in RAY_AUTH}
        return {**env, **RAY_ENV, "PYTHONPATH": self.env["PYTHONPATH"], "HOME": str(home), **auth}

    def add(self, name: str, shape: tuple[int, int, int]) -> None:
        self.shapes[name] = shape
        node = self.cluster.add_node(**self.node_args(name))
        self.names[node.node_id] = name
        self.nodes[name] = node

    def gpus(self, node_id: str) -> int:
        return self.shapes[self.names[node_id]][1]


def generate_token(home: Path) -> str:
    """A new token, made as docs/cluster.md makes one: `ray get-auth-token --generate` (~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_AUTH}
    made = subprocess.run([str(Path(sys.executable).parent / "ray"), "get-auth-token", "--generate"],
                          env={**env, "HOME": str(home)}, capture_output=True, text=True, check=True)
    token = (home / ".ray" / "auth_token").read_text()
    assert made.stdout == token and len(token) >= 32
    return token


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    from ray._private.authentication_test_utils import reset_auth_token_state
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("cluster")
    plugin = write_toy_plugin(root / "site")
    path = os.pathsep.join(filter(None, [str(TESTS), str(plugin), os.environ.get("PYTHONPATH")]))
    # The nodes' processes start here, before any test's environment: they are told themselves what
    # conftest tells every test, that no machine calibrates itself (optimize_kernel's oracle attempt would
    # otherwise score the start and the reference six times first, on a machine that no record has).
    env = {**RAY_ENV, "RAY_AUTH_MODE": "token", "PYTHONPATH": path, "TOY_BUILD_LOG": str(root / "builds.log"),
           "TOY_FAKE_GPUS": "1", "OPENREBENCH_SELF_CALIBRATION": "0"}
    saved = {k: os.environ.get(k) for k in (*RAY_ENV, *RAY_AUTH)}
    s = Sim(cluster=None, root=root, plugin=plugin, env=env, token=generate_token(root / "token-maker"))
    # The head's own processes (started from here) and this process, the driver: token mode, the token in
    # the driver's copy. Ray keeps the mode and the token in process-wide caches: reset them.
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(RAY_ENV, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(s.token_file("driver")))
    reset_auth_token_state()
    sys.path.insert(0, str(plugin))
    refresh()
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
        reset_auth_token_state()


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
                     log.samples[0].scores["rebench_scorer"].value) for log in found)
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


def test_an_attempt_runs_on_a_cluster_that_wants_a_token_its_worker_authenticated_by_its_node(
        sim: Sim, tmp_path: Path) -> None:
    """A driver with the token in RAY_AUTH_TOKEN runs an attempt end to end. The attempt's worker has its
    node's token (the file its raylet was started with), not the driver's: Ray does not pass it on, and
    the driver forwards no variable of Ray's."""
    logs = tmp_path / "logs"
    env = sim.driver_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=sim.token)
    done = subprocess.run([str(Path(sys.executable).parent / "openrebench"), "eval", "toy_gpu", "--cluster",
                           sim.cluster.address, "--log-dir", str(logs), "--runs-dir", str(tmp_path / "runs"),
                           "--display", "none"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (log,) = eval_logs(logs)
    assert log.status == "success" and log.samples[0].scores["rebench_scorer"].value == 1.0
    queue = AttemptQueue(logs / QUEUE_FILE)
    ((attempt, (t,)),) = [(a, queue.tries(a.id)) for a in queue.attempts()]
    queue.close()
    auth = json.loads((Path(attempt.run_dir or "") / "protected" / "ray_auth.json").read_text())
    node_copy = sim.token_file(sim.names[t.node or ""])
    assert auth == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(node_copy)}


@pytest.mark.parametrize(("auth", "why"), [
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
     "the cluster refused this driver's Ray auth token (not the one its nodes have)"),
    ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token but this driver has no token"),
    ({}, "the cluster wants Ray's auth token and this driver sends none (RAY_AUTH_MODE is not token)"),
], ids=["wrong-token", "no-token", "no-auth-mode"])
def test_a_driver_without_the_clusters_token_is_refused_in_one_line_that_says_what_to_do(
        sim: Sim, tmp_path: Path, auth: dict[str, str], why: str) -> None:
    logs = tmp_path / "logs"
    # A refused token: Ray tries 20 times, a second apart, before it gives up; once is enough here.
    env = {**sim.driver_env(tmp_path, **auth), "RAY_NUM_REDIS_GET_RETRIES": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "openrebench"), "eval", "toy_cpu", "--cluster",
                           sim.cluster.address, "--log-dir", str(logs), "--runs-dir", str(tmp_path / "runs"),
                           "--display", "none"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --cluster {sim.cluster.address}: {why}: every node and the driver "
                           "need the same token: RAY_AUTH_MODE=token"), last
    queue = AttemptQueue(logs / QUEUE_FILE)
    assert len(queue) == 0  # the driver stopped before queueing: the same command works once the token does
    queue.close()


def test_the_driver_passes_attempts_provider_keys_and_endpoints_and_never_rays_variables() -> None:
    environ = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "u", "RAY_AUTH_TOKEN": "t", "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": "/t", "HF_TOKEN": "h", "HOME": "/root"}
    assert forwarded_env(environ) == {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "u"}


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
    assert all(log.status == "success" and log.samples[0].scores["rebench_scorer"].value == 1.0
               for log in found)
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
    score = log.samples[0].scores["rebench_scorer"]
    assert log.status == "success" and score.value > 0.5, score
    assert Path(score.metadata["run_dir"]).is_relative_to(tmp_path / "runs")
