"""What the cluster tests share with the Ray workers they start (which import this module from the
tests folder, on the simulated nodes' PYTHONPATH): toy environments in a plug-in package, a toy
attempt that holds its GPUs for a while, and the simulated cluster's settings.

The toy environments run the real harness (Inspect eval, sandbox, scoring) in a second or two:
- `toy_cpu`: no GPU; its `build_assets` appends a line to TOY_BUILD_LOG whenever it really builds
  (its marker not yet in the node's cache), so a test can count builds per node;
- `toy_gpu`: a CPU tier that declares one GPU, so Ray gives it one and the harness leases it; its
  `write_run_files` records the GPUs the harness saw (OPENREBENCH_GPUS, CUDA_VISIBLE_DEVICES) and the
  worker's Ray auth variables (the token's value hidden: where the worker got its token). On the
  simulated nodes (TOY_FAKE_GPUS set) the plug-in tells the harness's hardware check that the machine
  has the GPUs Ray made visible, which exist in name only;
- `toy_slow`: one GPU too, and on a try's first attempt (a try folder named try1) its set-up sleeps
  for two minutes: the window in which a test kills its node or its driver.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

PACKAGE = "toycluster_plugin"

TOY_ENVS = '''
"""Toy environments for the cluster tests: write the sum of 1 to 10 into answer.txt."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import ClassVar

from openrebench.api import Direction, Environment, NormConstants, ScoreResult, TierSpec

if os.environ.get("TOY_FAKE_GPUS"):  # a simulated node: the GPUs Ray gives an attempt exist in name only
    from openrebench.runs import _hardware, _run

    _detect = _hardware.detect_hardware

    def _with_fake_gpus():
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        return _detect().model_copy(update={"gpu_count": len(visible)})

    _hardware.detect_hardware = _run.detect_hardware = _with_fake_gpus

def _tier(gpus: int) -> TierSpec:
    return TierSpec(name="mini", description="CPU, instant.", device="cpu", hardware="any CPU", gpus=gpus,
                    time_limit_hours=0.5, score_timeout_s=120, memory_limit_gb=2,
                    constants=NormConstants(start=55.0, reference=0.0, source="the answers' distances"))


class ToyCpu(Environment):
    id = "toy_cpu"
    rebench_id = "toy_cpu"
    title = "Toy: the sum of 1 to 10"
    version = "0.1.0"
    direction = Direction.MIN
    tiers: ClassVar[dict[str, TierSpec]] = {"mini": _tier(0)}

    def build_assets(self, tier: str, cache_dir: Path) -> None:
        marker = cache_dir / f"{self.id}-assets"
        if marker.exists():
            return
        time.sleep(0.5)  # long enough that two builds at once would overlap
        with open(os.environ["TOY_BUILD_LOG"], "a") as log:
            log.write(f"{cache_dir} {self.id} {tier}\\n")
        marker.write_text("built\\n")

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        try:
            answer = int((solution / "answer.txt").read_text()[:32].strip())
        except (OSError, ValueError):
            return ScoreResult.invalid("Invalid: answer.txt must hold an integer.")
        return ScoreResult(raw=float(abs(answer - 55)), message=f"Valid: answer {answer}.")


class ToyGpu(ToyCpu):
    id = "toy_gpu"
    rebench_id = "toy_gpu"
    tiers: ClassVar[dict[str, TierSpec]] = {"mini": _tier(1)}

    def write_run_files(self, tier: str, workspace: Path, protected: Path, cache_dir: Path) -> None:
        seen = f"{os.environ.get('OPENREBENCH_GPUS')} {os.environ.get('CUDA_VISIBLE_DEVICES')}"
        (protected / "gpus.txt").write_text(seen + "\\n")
        auth = {k: "(set)" if k == "RAY_AUTH_TOKEN" else v for k, v in os.environ.items()
                if k.startswith("RAY_AUTH_")}
        (protected / "ray_auth.json").write_text(json.dumps(auth))


class ToySlow(ToyGpu):
    id = "toy_slow"
    rebench_id = "toy_slow"

    def write_run_files(self, tier: str, workspace: Path, protected: Path, cache_dir: Path) -> None:
        super().write_run_files(tier, workspace, protected, cache_dir)
        # runs/<attempt>/try<n>/<hidden set-up folder>/workspace
        if workspace.parent.parent.name == "try1":
            time.sleep(120)
'''


def write_toy_plugin(root: Path) -> Path:
    """The toy environments as an installed distribution lays them out on the import path."""
    package = root / PACKAGE
    for folder, answer in (("starting", "0"), ("reference", "55")):
        (package / folder).mkdir(parents=True)
        (package / folder / "answer.txt").write_text(f"{answer}\n")
    (package / "__init__.py").write_text('"""Toy openrebench environments for the cluster tests."""\n')
    (package / "env.py").write_text(TOY_ENVS.lstrip())
    (package / "instructions.md").write_text("Write the sum of the integers 1 to 10 into answer.txt.\n")
    meta = root / f"{PACKAGE}-0.1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: toycluster-plugin\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text(
        "[openrebench.environments]\n" + "".join(f"{e} = {PACKAGE}.env:{c}\n" for e, c in
                                               (("toy_cpu", "ToyCpu"), ("toy_gpu", "ToyGpu"),
                                                ("toy_slow", "ToySlow"))))
    return root


# Ray with as little as it needs on a shared 2-core machine: no dashboard, no metrics, no usage
# report, no workers started ahead of tasks, a small object store.
RAY_ENV = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0",
           "RAY_enable_metrics_collection": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DISABLE_IMPORT_WARNING": "1"}
# Where Ray looks for its auth mode and token (the token: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
# names, else ~/.ray/auth_token), cleared or set by the tests whatever the shell that runs them has.
RAY_AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
OBJECT_STORE = 80 * 1024**2
GiB = 1024**3


def gpu_probe(spec_json: str, try_dir: str, meta: dict[str, Any]) -> dict[str, Any]:
    """A toy attempt: starts (the start marker, with the GPUs Ray gave it), holds them a second, ends."""
    from openrebench.cluster._node import mark_started

    start = mark_started(Path(try_dir), meta)
    time.sleep(1.0)
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return {"status": "done", "score": 1.0, "raw": 0.0, "log": None, "run_dir": None, "node": start["node"],
            "gpus": start["gpus"], "cuda_visible": seen, "started": start["started"], "ended": time.time()}
