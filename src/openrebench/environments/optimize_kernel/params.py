"""The settings of an optimize_kernel tier, read by the scorer and shown in the instructions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class YardstickParams(BaseModel):
    """A fixed workload the scorer times around the solution's calls, so that a shared machine's drifting
    speed does not move the score: the solution's time counts as ms x `ms` / the yardstick's time now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ms: float = Field(gt=0, description="The yardstick's median time on the calibration machine.")
    length: int = Field(gt=0, description="Elements of the yardstick's workload.")
    block: int = Field(gt=0, description="Yardstick runs before and after the timed calls.")


class KernelParams(BaseModel):
    """How the scorer times a solution on one tier."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    length: int = Field(gt=0, description="Elements of the input sequence the kernel is timed on.")
    warmup_calls: int = Field(ge=0, description="Untimed calls first (compilation, caches, allocator).")
    timed_calls: int = Field(gt=0, description=(
        "Timed windows: the median of their times per call is the score."))
    calls_per_window: int = Field(default=1, gt=0, description=(
        "Calls timed together, each on a fresh input, in one window: the exchange's fixed cost is shared "
        "by them (a GPU kernel of 0.4 ms against a millisecond of protocol)."))
    baseline_calls: int = Field(default=21, ge=0, description=(
        "Calls of the identity through the same protocol, before the solution is imported: their median "
        "is subtracted as the protocol's own cost (0: nothing is subtracted)."))
    call_timeout_s: float = Field(gt=0, description="The longest one call may take.")
    setup_timeout_s: float = Field(gt=0, description="The longest importing solution.py may take.")
    yardstick: YardstickParams | None = Field(default=None, description=(
        "Counts time relative to the machine's current speed (CPU tiers); None: plain milliseconds."))
