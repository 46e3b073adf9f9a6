"""example_fit: fit a curve to noisy points. A worked example of an environment plug-in.

Everything an environment needs, in one small package (see docs/architecture.md):

- this class: its id, its direction (lower raw scores are better here), its tiers;
- `instructions.md`, `starting/` (the agent's first workspace: score 0) and `reference/` (the hidden
  reference solution: score 1), which every sandbox masks;
- `files`: the training points go into the workspace, the held-out points into the protected folder,
  which only the scorer reads;
- `scorer.py` (named by `scorer`): runs in a fresh, sandboxed scorer process; the agent's code runs in a
  solution host of its own (`_host.py`, an unprivileged process that never sees the held-out targets), and
  the scorer compares;
- `calibration/`: the record `openrebench calibrate example_fit --tier mini --ship` wrote, which gives
  the tier its normalisation constants (the start's and the reference's raw scores).

The pyproject's entry point in `openrebench.environments` is all openrebench needs to find it.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from openrebench.api import (
    Direction,
    Environment,
    Placement,
    RunFiles,
    TierSpec,
)

HERE = Path(__file__).parent
HOST = "openrebench_example._host"
HELDOUT = "heldout.json"


class FitParams(BaseModel):
    """What a tier of example_fit is made of: typed, so the scorer reads attributes, not strings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_train: int = Field(gt=0, description="Training points in the workspace.")
    n_heldout: int = Field(gt=0, description="Held-out points the scorer predicts.")
    noise: float = Field(ge=0, description="Standard deviation of the noise added to y.")
    seed: int = Field(description="The seed of the points (the same for every run of the tier).")
    timeout_s: float = Field(gt=0, description="Seconds the solution has to import, and to answer.")


MINI = FitParams(n_train=200, n_heldout=500, noise=0.1, seed=7, timeout_s=30)


def curve(x: float) -> float:
    """The unknown function: smooth, not a low-degree polynomial."""
    return math.sin(3 * x) + 0.5 * x * x


def points(params: FitParams, n: int, stream: int) -> list[tuple[float, float]]:
    """`n` points of the curve with noise; `stream` keeps the training and held-out draws apart."""
    rng = random.Random(params.seed * 1000 + stream)
    xs = [rng.uniform(-1, 1) for _ in range(n)]
    return [(x, curve(x) + rng.gauss(0, params.noise)) for x in xs]


class ExampleFit(Environment[FitParams]):
    id = "example_fit"
    rebench_id = "example_fit"
    title = "Example: fit a curve to noisy points"
    version = "0.1.0"
    direction = Direction.MIN
    scorer = ".scorer:score"  # score(spec, solution, protected), imported only in the scorer process
    tiers: ClassVar[dict[str, TierSpec[FitParams]]] = {
        "mini": TierSpec(
            name="mini", description="CPU, a second per scoring: 200 training points, 500 held out.",
            device="cpu", hardware="any CPU", time_limit_hours=0.5, score_timeout_s=120, memory_limit_gb=2,
            params=MINI, calibration=HERE / "calibration" / "mini--any-cpu.json"),
    }

    def files(self, tier: str, cache_dir: Path) -> RunFiles:
        params = self.tier(tier).params
        train = "x,y\n" + "".join(f"{x:.6f},{y:.6f}\n" for x, y in points(params, params.n_train, 0))
        heldout = json.dumps(points(params, params.n_heldout, 1))
        return RunFiles(
            workspace=[*self.folder_files("starting"), Placement.text("data/train.csv", train)],
            protected=[Placement.text(HELDOUT, heldout)],
            reference=self.folder_files("reference"),
        )
