"""The calibration record: the starting and reference solutions' raw scores measured on one kind of
hardware, one JSON file each.

One format serves both kinds of record: those an environment ships in its `calibration/` folder (its
tiers read their default constants from them) and those `openrebench calibrate` writes. The run layer
measures, finds and chooses records; this module only says what a record is and reads a shipped one.
"""

from __future__ import annotations

import functools
import re
import statistics
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from openrebench.base import OpenRebenchError


class NormConstants(BaseModel):
    """Raw scores of the starting (normalised 0) and reference (normalised 1) solutions."""

    start: float
    reference: float
    source: str = Field(description="Where and how these were measured.")


class Stats(BaseModel):
    """Summary of repeated raw scores. For log-scale scores (ln ms) the standard deviation is the
    relative spread of the underlying quantity; the CV of a log is only meaningful away from zero."""

    values: list[float]
    mean: float
    median: float
    sd: float = 0.0
    cv: float = 0.0

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(values=values, mean=mean, median=statistics.median(values), sd=sd,
                   cv=abs(sd / mean) if mean else 0.0)


class Hardware(BaseModel):
    """The parts of a machine that change a score."""

    cpu_model: str
    cpu_count: int
    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    python: str
    platform: str
    cpu_flags: str | None = Field(default=None, description=(
        "A digest of the CPU's instruction-set flags that change code's speed (AVX, AVX-512, FMA, AMX...): "
        "one model name hides several generations in the cloud."))

    def key(self, device: str) -> str:
        """Calibration key: the GPU model for GPU tiers, the CPU model for CPU tiers (without what
        varies between machines of one model: see `model_key`)."""
        if device == "cuda":
            return f"cuda:{model_key(self.gpu_model or 'none')}"
        return f"cpu:{model_key(self.cpu_model)}"

    def fingerprint(self, device: str) -> str:
        """The machine as a machine-dependent tier's record must match it: the key, with the core count
        and the CPU's flags (CPU tiers) or the GPU count (GPU tiers). Stable from run to run: no
        timing enters it."""
        if device == "cuda":
            return f"{self.key(device)}|{self.gpu_count} GPU"
        return f"{self.key(device)}|{self.cpu_count} cores|flags {self.cpu_flags or 'unknown'}"


def model_key(name: str) -> str:
    """A processor's model name as a calibration key: trademarks, a rated clock ('@ 2.80GHz') and
    filler words dropped, spaces collapsed. /proc/cpuinfo reports one model with and without the
    clock, and virtual machines of one type with different clocks in the name."""
    name = re.sub(r"\((R|TM|tm|r)\)|®|™", "", name)
    name = re.sub(r"@\s*[\d.]+\s*[GM]Hz", "", name, flags=re.I)
    name = re.sub(r"\b(CPU|Processor|\d+-Core)\b", "", name, flags=re.I)
    return re.sub(r"\s+", " ", name).strip() or "unknown"


class CalibrationRecord(BaseModel):
    """One calibration: repeated scorings of the starting and the reference solution on one machine."""

    env_id: str
    env_version: str
    tier: str
    hardware_key: str
    hardware: Hardware
    # `Hardware.fingerprint` of the machine measured (None in records made before it existed): a tier
    # whose raw score depends on the machine (`TierSpec.machine_dependent`) calibrates a machine whose
    # fingerprint no record has.
    fingerprint: str | None = None
    start: Stats
    reference: Stats
    invalid: dict[str, int] = {}
    # The model per role the scorings called, for tiers that declare models: their score depends on the
    # model as much as on the hardware (a record is this machine's and these models').
    models: dict[str, str] = {}
    # Raw scores of the environment's probes (`Environment.probes`: solutions that game the scorer without
    # doing the task), beside the start's and the reference's: none should come near the start.
    probes: dict[str, Stats] = {}
    measured_at: datetime
    command: str
    package_version: str

    def summary(self) -> str:
        with_models = "".join(f" with {role}={model}" for role, model in sorted(self.models.items()))
        made_here = self.command.startswith("self-calibration")
        how = " (made by a run's set-up on this machine)" if made_here else ""
        return (f"calibration on {self.hardware_key}{with_models}, {self.measured_at:%Y-%m-%d}{how}: medians "
                f"of {len(self.start.values)} start / {len(self.reference.values)} reference scorings")

    def constants(self, origin: str) -> NormConstants:
        """The record's constants, `origin` ("local", "shipped") saying whose record it is."""
        return NormConstants(start=self.start.median, reference=self.reference.median,
                             source=f"{origin} {self.summary()}")


@functools.cache
def read_shipped_record(path: Path) -> CalibrationRecord:
    """A record shipped with an environment, read once per process. A missing or broken one is one line
    naming the file: tiers read their default constants from these, so nothing can run without them."""
    try:
        text = path.read_text()
    except OSError as e:
        raise OpenRebenchError(f"the shipped calibration record {path} cannot be read "
                               f"({e.strerror or type(e).__name__})") from None
    try:
        return CalibrationRecord.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        message = " ".join(str(first["msg"]).split())
        raise OpenRebenchError(f"the shipped calibration record {path} is broken ({e.error_count()} "
                               f"problem(s); {where}: {message})") from None
