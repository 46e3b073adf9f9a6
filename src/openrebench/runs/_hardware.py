"""What machine a score was measured on: the key for calibration records and the run fingerprint."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys

from pydantic import BaseModel

from openrebench.api._environment import TierSpec


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

    def key(self, device: str) -> str:
        """Calibration key: the GPU model for GPU tiers, the CPU model for CPU tiers (without what
        varies between machines of one model: see `model_key`)."""
        if device == "cuda":
            return f"cuda:{model_key(self.gpu_model or 'none')}"
        return f"cpu:{model_key(self.cpu_model)}"


def model_key(name: str) -> str:
    """A processor's model name as a calibration key: trademarks, a rated clock ('@ 2.80GHz') and
    filler words dropped, spaces collapsed. /proc/cpuinfo reports one model with and without the
    clock, and virtual machines of one type with different clocks in the name."""
    name = re.sub(r"\((R|TM|tm|r)\)|®|™", "", name)
    name = re.sub(r"@\s*[\d.]+\s*[GM]Hz", "", name, flags=re.I)
    name = re.sub(r"\b(CPU|Processor|\d+-Core)\b", "", name, flags=re.I)
    return re.sub(r"\s+", " ", name).strip() or "unknown"


def tier_hardware_problem(spec: TierSpec, hardware: Hardware | None = None) -> str | None:
    """Why this machine cannot run the tier (None when it can): checked before anything is built."""
    if spec.gpu_count == 0:
        return None
    hardware = hardware or detect_hardware()
    if hardware.gpu_count >= spec.gpu_count:
        return None
    has = "no CUDA GPU" if hardware.gpu_count == 0 else f"{hardware.gpu_count} CUDA GPU(s)"
    return (f"the {spec.name} tier needs {spec.gpu_count} CUDA GPU(s) ({spec.hardware}); PyTorch sees {has} "
            "on this machine (the mini tier runs on a CPU: --tier mini)")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


@functools.cache
def detect_hardware() -> Hardware:
    """Describe this machine (imports torch; cached)."""
    import torch

    gpu_model = gpu_driver = None
    gpu_count = 0
    if torch.cuda.is_available():
        gpu_count = torch.cuda.device_count()
        gpu_model = torch.cuda.get_device_name(0)
        gpu_driver = _gpu_driver()
    return Hardware(
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 1,
        gpu_model=gpu_model,
        gpu_count=gpu_count,
        gpu_driver=gpu_driver,
        cuda=torch.version.cuda,
        torch=torch.__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
    )
