"""The node's side: what a Ray worker runs for an attempt and for a node's asset preparation.

An attempt is the same Inspect eval of one sample that `openrebench eval` runs on one machine (the
environment's task, its sandbox, the scoring service, the model gateway), with the try's folder as its
runs directory and the try's own log directory; the driver moves the finished log into the eval's log
directory. Ray has given the worker the attempt's GPUs (`CUDA_VISIBLE_DEVICES`); the harness's GPU lease
is pointed at exactly those (`OPENREBENCH_GPUS`), so the sandbox shows the attempt those device nodes
and no other.

The try's folder (shared storage, the same path on every node) gets `cluster-start.jsonl` when the
attempt starts (its node, GPUs and start time: the driver's "running") and `cluster-result.jsonl` when it
ends, which a restarted driver adopts instead of running the attempt again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from openrebench.base import OpenRebenchError, cache_dir
from openrebench.runs import ScoreMetadata

from ._spec import AttemptSpec

START_FILE = "cluster-start.jsonl"
RESULT_FILE = "cluster-result.jsonl"
LOST_FILE = "cluster-lost.jsonl"
TRY_LOG_DIR = "inspect"


def node_identity() -> dict[str, Any]:
    """The Ray node, host and GPUs of the current worker."""
    import ray

    ctx = ray.get_runtime_context()
    gpus = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
    return {"node": ctx.get_node_id(), "host": socket.gethostname(), "gpus": gpus, "pid": os.getpid()}


def mark_started(try_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Record where and when the try started (its first command): the driver shows it running."""
    if not try_dir.is_dir():
        raise OpenRebenchError(f"{try_dir} is not on this node ({socket.gethostname()}): --runs-dir must be "
                               "shared storage, mounted at the same path on every node")
    record = {**meta, **node_identity(), "started": time.time()}
    _write_line(try_dir / START_FILE, record)
    return record


def _write_line(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, written whole (a reader never sees half of it)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(record) + "\n")
    partial.replace(path)


def read_line(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _node_lock(name: str) -> Any:
    """A lock of this node's (its cache directory's): asset builds of one environment and tier one at a
    time, however many attempts and preparations start together."""
    folder = cache_dir() / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


def prepare_assets(env_id: str, tier: str) -> dict[str, Any]:
    """Build (or find built) the tier's assets in this node's cache, once per node: the driver runs this
    on each node before its attempts start there; an attempt that comes first waits on the same lock
    and finds them built. Returns what was done, for the driver's record."""
    from openrebench.runs import get_environment

    started = time.monotonic()
    with _node_lock(f"{env_id}--{tier}") as folder:
        waited = time.monotonic() - started
        record_path = folder / f"{env_id}--{tier}.prepared.jsonl"
        before = read_line(record_path)
        get_environment(env_id).build_assets(tier, cache_dir())
        record = {**node_identity(), "env_id": env_id, "tier": tier, "cache": str(cache_dir()),
                  "waited_s": waited, "seconds": time.monotonic() - started - waited,
                  "first": before is None, "time": time.time()}
        if before is None:
            _write_line(record_path, record)
    return record


def run_attempt(spec_json: str, try_dir: str, meta: dict[str, Any]) -> dict[str, Any]:
    """One try of one attempt on this node: the environment's Inspect eval of one sample. Returns its
    result (`status` done or failed, the log's path in the try's folder, the score, the run directory,
    the reason of a failure), also written to the try's folder."""
    spec = AttemptSpec.from_json(spec_json)
    folder = Path(try_dir)
    start = mark_started(folder, meta)
    if start["gpus"]:  # the harness's lease takes exactly the GPUs Ray gave this worker
        os.environ["OPENREBENCH_GPUS"] = ",".join(start["gpus"])
    prepare_assets(spec.env_id, spec.tier)

    from inspect_ai import eval as inspect_eval

    from openrebench.harness import environment_tasks, resolve_agent_model

    task = environment_tasks()[spec.env_id](runs_dir=str(folder), **spec.task_args())
    model, serving = resolve_agent_model(spec.model)
    with serving:
        (log,) = inspect_eval(task, model=model or "none", epochs=1, log_dir=str(folder / TRY_LOG_DIR),
                              display="none", metadata={"cluster": {**meta, "node": start["node"],
                                                                    "host": start["host"],
                                                                    "gpus": start["gpus"]}})
    result = {**summarise(log, folder), "node": start["node"], "gpus": start["gpus"],
              "started": start["started"], "ended": time.time()}
    _write_line(folder / RESULT_FILE, result)
    return result


def summarise(log: Any, try_dir: Path) -> dict[str, Any]:
    """What the driver keeps of an attempt's Inspect log: done with its score, else failed and why."""
    sample = log.samples[0] if log.samples else None
    score = next(iter(sample.scores.values()), None) if sample is not None and sample.scores else None
    try:
        meta = ScoreMetadata.read(score.metadata if score is not None else None, str(log.location))
    except OpenRebenchError:  # the attempt is kept, whatever its log says: its score still counts
        meta = ScoreMetadata()
    runs = sorted(str(p.parent) for p in try_dir.glob("*/run.json"))
    out: dict[str, Any] = {"log": log.location, "run_dir": meta.run_dir or (runs[-1] if runs else None)}
    if log.status == "success" and score is not None and sample is not None and sample.error is None:
        return {**out, "status": "done", "score": float(score.value), "raw": meta.raw}
    if sample is not None and sample.error is not None:
        reason = one_line(sample.error.message, sample.error.traceback)
    elif sample is not None and not sample.scores:
        reason = f"{sample.limit.type} limit hit" if sample.limit else "the sample was not scored"
    elif log.error is not None:
        reason = one_line(log.error.message, log.error.traceback)
    else:
        reason = f"eval status {log.status}"
    return {**out, "status": "failed", "reason": reason}


def one_line(message: str | None, traceback: str | None = None) -> str:
    """An error as its traceback's last line states it, without the exception's module path."""
    lines = [x.strip() for x in (traceback or "").splitlines() if x.strip()]
    if lines and re.match(r"[\w.]+(: |$)", lines[-1]):
        line = lines[-1]
    else:
        line = next((x.strip() for x in (message or "").splitlines() if x.strip()), "no message")
    return re.sub(r"^(?:\w+\.)+(?=\w+(: |$))", "", line)[:300]


def trivial_attempt(spec_json: str, try_dir: str, meta: dict[str, Any]) -> dict[str, Any]:
    """An attempt that only starts and ends (no Inspect, no sandbox): what the scheduler alone costs,
    for the overhead benchmark and the scheduler's tests."""
    start = mark_started(Path(try_dir), meta)
    return {"status": "done", "score": 0.0, "raw": None, "log": None, "run_dir": None,
            "node": start["node"], "gpus": start["gpus"], "started": start["started"], "ended": time.time()}
