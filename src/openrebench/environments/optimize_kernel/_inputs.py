"""Trusted helpers of the scorer: inputs and the exact answer. They run only in the scorer process;
no seed, input or expected output is sent anywhere before the call that uses it is being timed.

The CPU tier's are NumPy arrays: its scorer never imports torch (the host does; a second import of
torch in every scoring cost about 2 s of CPU). CUDA inputs are torch tensors, made on the device."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def fresh_array(n: int, low: int, high: int) -> np.ndarray:
    """A CPU input from a seed drawn now, used once and never kept: uniform integers in [low, high)."""
    return np.random.default_rng(secrets.randbits(62)).integers(low, high, n, np.int32)


def expected_array(a: np.ndarray) -> np.ndarray:
    """Y_i = sum_{j<=i} x_j * [(#k<j with x_k > 0) mod 2], in wrapping int32 (the int32 cast of the
    int64 sum: the same values)."""
    if a.size == 0:
        return a.copy()
    odd = np.empty(a.size, dtype=np.int32)
    odd[0] = 0
    np.cumsum(a[:-1] > 0, dtype=np.int32, out=odd[1:])
    odd &= 1
    return np.cumsum(a * odd, dtype=np.int32)


def make_input(spec: dict[str, Any], device: torch.device) -> torch.Tensor:
    """spec = {"n", "low", "high", "seed"}: uniform integers in [low, high), int32."""
    import torch

    gen = torch.Generator(device=device).manual_seed(int(spec["seed"]))
    return torch.randint(int(spec["low"]), int(spec["high"]), (int(spec["n"]),), generator=gen,
                         device=device, dtype=torch.int32)


def fresh_input(n: int, low: int, high: int, device: torch.device) -> torch.Tensor:
    """A device input from a seed drawn now, used once and never kept."""
    return make_input({"n": n, "low": low, "high": high, "seed": secrets.randbits(62)}, device)


def expected_output(x: torch.Tensor) -> torch.Tensor:
    """`expected_array` for a tensor: in int64 cast to int32 with torch on a device, with NumPy on the CPU
    (the same values, several times faster there)."""
    import torch

    if x.device.type == "cpu":
        return torch.from_numpy(expected_array(x.numpy()))
    odd_before = torch.zeros_like(x, dtype=torch.int64)
    odd_before[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
    return (x.to(torch.int64) * odd_before).cumsum(0).to(torch.int32)
