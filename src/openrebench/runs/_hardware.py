"""What machine a score was measured on: the key for calibration records and the run fingerprint."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from typing import Any

from openrebench.api import Hardware, TierSpec, model_key

# The record format (Hardware, model_key) lives with the records in api; detecting this machine is here.
__all__ = ["Hardware", "detect_hardware", "model_key", "tier_hardware_problem"]


def tier_hardware_problem(spec: TierSpec[Any], hardware: Hardware | None = None) -> str | None:
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


SPEED_FLAGS = re.compile(r"^(sse4_[12]|avx\w*|fma\w*|f16c|bmi[12]|amx\w*|sha_ni|vaes|vpclmulqdq|gfni|"
                         r"asimd\w*|sve\w*|neon)$")


def _cpu_flags() -> str | None:
    """A short digest of the CPU flags that change how fast code runs (the first processor's)."""
    import hashlib

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = sorted(x for x in line.split(":", 1)[1].split() if SPEED_FLAGS.match(x))
                    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:10]
    except OSError:
        pass
    return None


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
        cpu_flags=_cpu_flags(),
    )
