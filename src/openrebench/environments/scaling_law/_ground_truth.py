"""The ground truth of scaling_law: held-out losses of models trained at exactly the target budget.

A sweep trains one model per (width, seed) with max_iters set by the budget, on the training split,
and measures each on the held-out split that neither the agent nor its experiments see. The file is
data kept with the environment (`reference/ground_truth--<tier>.json`, masked from sandboxes like the
reference solution) and copied into a run's protected folder at set-up.

The true loss at a width between sweep points is interpolated piecewise linearly in ln(n_embd)
through the mean loss (over seeds) of each swept width: exact at the points, no assumption about the
curve's shape, and the optimum L_opt is the lowest point, so a perfect answer scores exactly 1.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from openrebench.api import TierSpec, stage
from openrebench.lm import Corpus, Deadline, assets_root, cached_build
from openrebench.runs import detect_hardware

from .experiment import Result, run_experiment
from .params import ScalingLawParams, Setup

BUILDER_VERSION = "1"
INTERPOLATION = "piecewise linear in ln(n_embd) through the mean held-out loss (over seeds) of each width"


class DataKey(BaseModel):
    """Which token files the sweep used: a run's data must be the same for the ground truth to hold."""

    corpus: str
    vocab_size: int
    train_sha256: str
    heldout_sha256: str

    @classmethod
    def of(cls, corpus: Corpus, vocab_size: int) -> DataKey:
        files = corpus.manifest.files
        return cls(corpus=corpus.kind, vocab_size=vocab_size, train_sha256=files["train.bin"].sha256,
                   heldout_sha256=files["heldout.bin"].sha256)


class GroundTruth(BaseModel):
    """A sweep at the target budget, with how it was made."""

    env_id: Literal["scaling_law"] = "scaling_law"
    tier: str
    setup: Setup
    data: DataKey
    interpolation: str = INTERPOLATION
    points: list[Result] = Field(description="One per (width, seed); `loss` is the held-out loss.")
    command: str
    hardware: dict[str, Any]
    device: str
    created_at: datetime
    seconds: float = Field(description="Training and evaluation time of all points.")

    def curve(self) -> list[tuple[int, float]]:
        """(n_embd, mean held-out loss) for each swept width, by width."""
        by_width: dict[int, list[float]] = {}
        for p in self.points:
            by_width.setdefault(p.n_embd, []).append(p.loss)
        return sorted((w, statistics.fmean(losses)) for w, losses in by_width.items())

    def loss_at(self, n_embd: int) -> float:
        """The interpolated held-out loss at a width inside the swept range."""
        curve = self.curve()
        widths = [w for w, _ in curve]
        if not widths[0] <= n_embd <= widths[-1]:
            raise ValueError(f"n_embd={n_embd} is outside the swept range {widths[0]}..{widths[-1]}")
        i = bisect.bisect_left(widths, n_embd)
        if widths[i] == n_embd:
            return curve[i][1]
        (w0, l0), (w1, l1) = curve[i - 1], curve[i]
        t = (math.log(n_embd) - math.log(w0)) / (math.log(w1) - math.log(w0))
        return l0 + t * (l1 - l0)

    def optimum(self) -> tuple[int, float]:
        """The best swept width and its loss (the minimum of the interpolant)."""
        return min(self.curve(), key=lambda p: p[1])


def ground_truth_path(root: Path, tier: str) -> Path:
    return root / "reference" / f"ground_truth--{tier}.json"


def sweep(spec: TierSpec[ScalingLawParams], setup: Setup, data: Corpus, cache_dir: Path | None, *,
          widths: list[int], seeds: list[int], device: str, command: str,
          on_point: Callable[[Result, bool], None] | None = None) -> GroundTruth:
    """Train and evaluate every (width, seed) at the target budget; each point is cached on its own
    (`<cache>/lm/scaling-<tier>-sweep/`), so an interrupted sweep resumes where it stopped."""
    key = DataKey.of(data, setup.vocab_size)
    points: list[Result] = []
    seconds = 0.0
    with stage(f"scaling_law {spec.name}: ground-truth sweep", total=len(widths) * len(seeds)) as swept:
        for n_embd, seed in itertools.product(widths, seeds):
            max_iters = setup.max_iters_for(n_embd, setup.target_flops)
            folder = assets_root(cache_dir) / f"scaling-{spec.name}-sweep" / f"d{n_embd}-s{seed}"
            fresh = False

            def build(partial: Path, deadline: Deadline, n_embd: int = n_embd, seed: int = seed,
                      max_iters: int = max_iters) -> tuple[dict[str, Any], dict[str, Any]]:
                nonlocal fresh
                fresh = True
                result = run_experiment(setup, n_embd, max_iters, data.bin_path("train"),
                                        data.bin_path("heldout"), seed=seed, device=device, enforce_cap=False)
                (partial / "result.json").write_text(result.model_dump_json(indent=2) + "\n")
                return {"data": key.model_dump()}, {"device": device}

            cached_build(folder, what=f"sweep:scaling_law-{spec.name}", builder_version=BUILDER_VERSION,
                         seed=seed, params={"setup": setup.model_dump(), "data": key.model_dump(),
                                            "n_embd": n_embd, "max_iters": max_iters}, build=build,
                         label=f"n_embd={n_embd}, seed={seed}, {max_iters} steps")
            result = Result.model_validate_json((folder / "result.json").read_text())
            points.append(result)
            seconds += result.seconds
            swept.advance()
            if on_point:
                on_point(result, fresh)
    return GroundTruth(tier=spec.name, setup=setup, data=key, points=points, command=command,
                       hardware=detect_hardware().model_dump(), device=device, created_at=datetime.now(UTC),
                       seconds=round(seconds, 3))
