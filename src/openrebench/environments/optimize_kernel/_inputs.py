"""Trusted helpers of the scorer: inputs and the exact answer. They run only in the scorer process;
no seed, input or expected output is sent anywhere before the call that uses it is being timed."""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import torch


def make_input(spec: dict[str, Any], device: torch.device) -> torch.Tensor:
    """spec = {"n", "low", "high", "seed"}: uniform integers in [low, high), int32."""
    gen = torch.Generator(device=device).manual_seed(int(spec["seed"]))
    return torch.randint(int(spec["low"]), int(spec["high"]), (int(spec["n"]),), generator=gen,
                         device=device, dtype=torch.int32)


def fresh_input(n: int, low: int, high: int, device: torch.device) -> torch.Tensor:
    """An input from a seed drawn now, used once and never kept (NumPy on the CPU: several times faster)."""
    if device.type == "cpu":
        return torch.from_numpy(np.random.default_rng(secrets.randbits(62)).integers(low, high, n, np.int32))
    return make_input({"n": n, "low": low, "high": high, "seed": secrets.randbits(62)}, device)


def expected_output(x: torch.Tensor) -> torch.Tensor:
    """Y_i = sum_{j<=i} x_j * [(#k<j with x_k > 0) mod 2]: in int64 cast to int32 with torch, or directly
    in wrapping int32 with NumPy on the CPU (the same values, several times faster there)."""
    if x.device.type == "cpu" and x.numel() > 0:
        a = x.numpy()
        odd = np.empty(a.size, dtype=np.int32)
        odd[0] = 0
        np.cumsum(a[:-1] > 0, dtype=np.int32, out=odd[1:])
        odd &= 1
        return torch.from_numpy(np.cumsum(a * odd, dtype=np.int32))
    odd_before = torch.zeros_like(x, dtype=torch.int64)
    odd_before[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
    return (x.to(torch.int64) * odd_before).cumsum(0).to(torch.int32)
