"""Exclusive GPUs per attempt: a lease on GPU indices, held by an open, locked file per GPU.

Locks live in the cache directory, so every harness process on the machine (several `inspect eval`s
at once) sees the same leases; a crashed harness releases its GPUs when the kernel closes its files.
The sandbox then shows only the leased device nodes, so an attempt cannot even open another GPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from openrebench.base import OpenRebenchError, cache_dir

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def visible_gpus() -> list[int]:
    """GPU indices on this machine: OPENREBENCH_GPUS ('0,1') if set, else the /dev/nvidiaN nodes."""
    override = os.environ.get("OPENREBENCH_GPUS")
    if override is not None:
        try:
            return [int(x) for x in override.split(",") if x.strip()]
        except ValueError:
            raise OpenRebenchError(f"OPENREBENCH_GPUS='{override}' is not a list of GPU indices") from None
    return sorted(int(m.group(1)) for p in glob.glob("/dev/nvidia*")
                  if (m := re.fullmatch(r"/dev/nvidia(\d+)", p)))


class GpuLease:
    """`count` GPUs held exclusively until `release()` (or the holder's exit)."""

    def __init__(self, indices: list[int], files: list[int]) -> None:
        self.indices = indices
        self._files = files

    @classmethod
    def acquire(cls, count: int, *, timeout_s: float | None = None,
                on_wait: Callable[[str], None] | None = None) -> GpuLease:
        """Wait until `count` GPUs are free and take them; errors at once if the machine has too few."""
        gpus = visible_gpus()
        if count > len(gpus):
            raise OpenRebenchError(f"this environment needs {count} GPU(s); this machine shows {len(gpus)}")
        lock_dir = cache_dir() / "gpu-locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while True:
            held: list[tuple[int, int]] = []
            for index in gpus:
                fd = os.open(lock_dir / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                held.append((index, fd))
                if len(held) == count:
                    return cls([i for i, _ in held], [f for _, f in held])
            for _, fd in held:
                os.close(fd)
            if deadline is not None and time.monotonic() > deadline:
                raise OpenRebenchError(f"no {count} free GPU(s) within {timeout_s:g} s")
            if on_wait and not told:
                on_wait(f"waiting for {count} free GPU(s); all {len(gpus)} are leased")
                told = True
            time.sleep(1.0)

    def device_nodes(self, dev: Path = Path("/dev")) -> list[str]:
        """The device files an attempt holding this lease may see: its GPUs and the control nodes."""
        names = [f"nvidia{i}" for i in self.indices] + list(CONTROL_NODES)
        return [str(dev / n) for n in names if (dev / n).exists()]

    def release(self) -> None:
        for fd in self._files:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files = []


def all_gpu_nodes() -> list[str]:
    """Every NVIDIA device node (for scoring outside the harness, which leases GPUs instead)."""
    return sorted(glob.glob("/dev/nvidia*"))
