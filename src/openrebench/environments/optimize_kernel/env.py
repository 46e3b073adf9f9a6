"""optimize_kernel: RE-Bench's "Optimize a Kernel" (ai_rd_triton_cumsum)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

from openrebench.core import Direction, Environment, NormConstants, ScoreResult, TierSpec


class OptimizeKernel(Environment):
    id = "optimize_kernel"
    rebench_id = "ai_rd_triton_cumsum"
    title = "Optimize a kernel: a conditional prefix sum"
    version = "1.0.0"
    direction = Direction.MIN
    score_visible = True
    tiers: ClassVar[dict[str, TierSpec]] = {
        "mini": TierSpec(
            name="mini", description="CPU, 2**22 elements: the starting solution takes tens of milliseconds.",
            device="cpu", hardware="any x86-64 or arm64 CPU (2 cores are enough)", time_limit_hours=2,
            score_timeout_s=300, memory_limit_gb=6,
            params={"length": 2**22, "warmup_calls": 3, "timed_calls": 20, "call_timeout_s": 30,
                    "setup_timeout_s": 120},
            default_constants=NormConstants(
                start=math.log(80.0), reference=math.log(8.0),
                source="estimate for a 2-core Xeon, used only until calibrated"),
        ),
        "full": TierSpec(
            name="full", description="One CUDA GPU, 1e8 elements, as in the paper.",
            device="cuda", hardware="one NVIDIA GPU (H100/H200 class), Triton", time_limit_hours=8,
            score_timeout_s=900, memory_limit_gb=32,
            params={"length": 100_000_000, "warmup_calls": 3, "timed_calls": 10, "call_timeout_s": 120,
                    "setup_timeout_s": 300},
            default_constants=NormConstants(
                start=math.log(4.76), reference=math.log(1.6),
                source="RE-Bench paper, H100 (used only until calibrated)"),
            paper_constants=NormConstants(
                start=math.log(4.76), reference=math.log(1.6),
                source="RE-Bench paper (arXiv 2411.15114), H100: start 4.76 ms, reference 1.6 ms"),
        ),
    }

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        from .scorer import score

        return score(self.tier(tier), solution)
