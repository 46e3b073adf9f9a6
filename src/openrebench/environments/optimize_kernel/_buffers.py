"""Memory the scorer owns and lends to the solution host: where each call's input is placed.

CPU: one sealed memfd (it cannot be shrunk, so the scorer's own mapping can never fault), inherited by
the host and mapped there. CUDA: the scorer allocates an input and an output buffer on its GPU and
sends their CUDA IPC handles; the host opens them with class and dtype chosen by itself, never
taken from the wire. Both sides see the same bytes; only the scorer decides what is written when.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import mmap
import os
from typing import Any

import torch


class CpuInput:
    """An int32 buffer of n elements in a sealed memfd: `tensor` maps it, `fd` is what the host inherits."""

    def __init__(self, n: int) -> None:
        self.fd = os.memfd_create("optimize-kernel-input", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(4 * n, 4))
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self._map = mmap.mmap(self.fd, max(4 * n, 4))
        self.tensor = torch.frombuffer(self._map, dtype=torch.int32, count=n)

    @staticmethod
    def open(fd: int, n: int) -> torch.Tensor:
        """The host's view of the buffer (mapped before the solution is imported)."""
        return torch.frombuffer(mmap.mmap(fd, max(4 * n, 4)), dtype=torch.int32, count=n)

    def close(self) -> None:
        del self.tensor
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)


class CudaBuffers:
    """Input and output buffers of n int32 on the scorer's GPU, shared with the host by CUDA IPC.

    The wire carries only the storage handle fields of `_share_cuda_()`, base64-encoded where bytes;
    the host rebuilds plain int32 tensors from them with `_new_shared_cuda`.
    """

    def __init__(self, n: int, device: torch.device) -> None:
        self.input = torch.zeros(n, dtype=torch.int32, device=device)
        self.output = torch.zeros(n, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)
        self.wire = {"input": self._share(self.input), "output": self._share(self.output), "n": n}

    @staticmethod
    def _share(t: torch.Tensor) -> list[Any]:
        fields = list(t.untyped_storage()._share_cuda_())
        # The reference counter lives in a shared-memory file the scorer (root in the scoring sandbox)
        # creates; the host runs as another uid and must be able to open it.
        if isinstance(fields[4], bytes):
            with contextlib.suppress(OSError):
                os.chmod("/dev/shm/" + fields[4].decode().lstrip("/"), 0o666)
        return [{"b64": base64.b64encode(f).decode()} if isinstance(f, bytes) else f for f in fields]

    @staticmethod
    def open(wire: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The host's input and output tensors (called before the solution is imported)."""
        n = int(wire["n"])

        def rebuild(fields: list[Any]) -> torch.Tensor:
            args = [base64.b64decode(f["b64"]) if isinstance(f, dict) else f for f in fields]
            torch.cuda.set_device(int(args[0]))
            storage = torch.UntypedStorage._new_shared_cuda(*args)
            return torch.empty(0, dtype=torch.int32, device=f"cuda:{int(args[0])}").set_(
                storage, 0, (n,), (1,))

        return rebuild(wire["input"]), rebuild(wire["output"])
