"""Memory the scorer owns and lends to the solution host: where each call's input is placed.

CPU: one sealed memfd (`_start.input_memfd`: it cannot be shrunk, so the scorer's own mapping can never
fault), inherited by the host and mapped there. CUDA: an allocation of its own (cuMemAlloc, outside
torch's caching allocator, so no private tensor of the scorer ever shares it) lent by CUDA IPC; in the
other direction the host lends the allocation holding its result, which the scorer maps and compares in
place, so no copy is counted that a rewritten host could skip. CUDA IPC does not cross uids: on a GPU the
scorer runs as the solution's uid (see _start.py). Both sides see the same bytes; only the scorer decides
what is written when. The driver API is used through ctypes (libcuda is wherever a CUDA GPU is). torch is
imported only where a tensor is made: the CPU scorer maps its buffer with NumPy and never imports it.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import mmap
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


class CpuInput:
    """The scorer's view of the input buffer, an int32 memfd of n elements (`_start.input_memfd`, sealed)
    that the host inherited: `array` maps it (NumPy, so that the scorer needs no torch). The fd stays the
    caller's."""

    def __init__(self, fd: int, n: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, max(4 * n, 4))
        self.array = np.frombuffer(self._map, dtype=np.int32, count=n)

    @staticmethod
    def open(fd: int, n: int) -> torch.Tensor:
        """The host's view of the buffer (mapped before the solution is imported), made as torch makes
        a shared tensor it receives from another process: its storage knows its file, so a solution that
        hands the input to a worker through torch.multiprocessing shares these very pages. A tensor over
        a plain mapping would instead be moved into new shared memory at its first sending, leaving the
        host to read a stale copy from then on."""
        import torch

        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, max(4 * n, 4))
        return torch.empty(0, dtype=torch.int32).set_(storage, 0, (n,), (1,))

    def close(self) -> None:
        del self.array
        with contextlib.suppress(BufferError):
            self._map.close()


class CudaIpcError(RuntimeError):
    """A CUDA IPC step failed (a bad handle from the host, or the driver refused)."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _cu(name: str, *args: object) -> None:
    """Call a driver function (its _v2 version where there is one); raise on an error code."""
    lib = _driver()
    fn = getattr(lib, f"{name}_v2", None) or getattr(lib, name)
    code = fn(*args)
    if code:
        raise CudaIpcError(f"{name} failed with CUDA error {code}")


class _CudaArray:
    """Enough of __cuda_array_interface__ for torch.as_tensor to view device memory it does not own."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i4", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _view(ptr: int, n: int, device: torch.device) -> torch.Tensor:
    import torch

    return torch.as_tensor(_CudaArray(ptr, n), device=device)


def _range(ptr: int) -> tuple[int, int]:
    """The base and size of the allocation holding `ptr`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _cu("cuMemGetAddressRange", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    return base.value, size.value


def _export(ptr: int) -> dict[str, Any]:
    base, size = _range(ptr)
    handle = _IpcHandle()
    _cu("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(base))
    # bytes(handle), not handle.reserved: a c_char array's value stops at its first NUL byte
    return {"handle": base64.b64encode(bytes(handle)).decode(), "offset": ptr - base, "size": size}


def _open(handle_b64: object) -> tuple[int, int]:
    if not isinstance(handle_b64, str):
        raise CudaIpcError("the handle is not a string")
    raw = base64.b64decode(handle_b64, validate=True)
    if len(raw) != 64:
        raise CudaIpcError("the handle is not 64 bytes")
    handle = _IpcHandle.from_buffer_copy(raw)
    ptr = ctypes.c_uint64()
    _cu("cuIpcOpenMemHandle", ctypes.byref(ptr), handle, ctypes.c_uint(1))  # lazy peer access
    return ptr.value, _range(ptr.value)[1]


class CudaInput:
    """The scorer's input buffer of n int32 on its GPU, in an allocation of its own, lent by CUDA IPC."""

    def __init__(self, n: int, device: torch.device) -> None:
        import torch

        torch.zeros(1, device=device)  # the primary context, current on this thread for the driver API
        self.n, self.device = n, device
        ptr = ctypes.c_uint64()
        _cu("cuMemAlloc", ctypes.byref(ptr), ctypes.c_size_t(max(4 * n, 4)))
        self.ptr = ptr.value
        self.tensor = _view(self.ptr, n, device)
        self.wire = {**_export(self.ptr), "n": n}

    @staticmethod
    def open(wire: dict[str, Any], device: torch.device) -> torch.Tensor:
        """The host's view of the buffer (opened before the solution is imported)."""
        import torch

        torch.zeros(1, device=device)
        ptr, _ = _open(wire["handle"])
        return _view(ptr + int(wire["offset"]), int(wire["n"]), device)

    def close(self) -> None:
        import torch

        del self.tensor
        torch.cuda.synchronize(self.device)
        with contextlib.suppress(CudaIpcError):
            _cu("cuMemFree", ctypes.c_uint64(self.ptr))


def export_result(y: torch.Tensor) -> dict[str, Any]:
    """Host side: where the scorer finds `y` (a handle to the allocation holding it, and the offset)."""
    return _export(y.data_ptr())


class CudaResults:
    """Scorer side: the host's results viewed in place. Each allocation the host lends is mapped once
    and kept (the host's caching allocator hands the same memory back call after call)."""

    MAX_MAPPINGS = 128  # windows of many calls lend one allocation per result

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.mapped: dict[str, tuple[int, int]] = {}

    def view(self, reply: dict[str, Any], n: int) -> torch.Tensor:
        info = reply.get("cuda")
        if not isinstance(info, dict):
            raise CudaIpcError("the reply does not say where the result is")
        handle, offset = info.get("handle"), info.get("offset")
        if type(offset) is not int or offset < 0 or offset % 4:
            raise CudaIpcError("the result's offset is not a valid int32 offset")
        if handle not in self.mapped:
            if len(self.mapped) >= self.MAX_MAPPINGS:
                raise CudaIpcError(f"the host lent more than {self.MAX_MAPPINGS} different allocations")
            self.mapped[str(handle)] = _open(handle)
        ptr, size = self.mapped[str(handle)]
        if offset + 4 * n > size:
            raise CudaIpcError("the result does not fit in the allocation the host lent")
        return _view(ptr + offset, n, self.device)

    def close(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        for ptr, _ in self.mapped.values():
            with contextlib.suppress(CudaIpcError):
                _cu("cuIpcCloseMemHandle", ctypes.c_uint64(ptr))
        self.mapped.clear()
