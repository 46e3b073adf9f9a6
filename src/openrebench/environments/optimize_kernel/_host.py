"""The solution host: the only process that runs the agent's code.

Nothing in this process is trusted once solution.py is imported: the solution may rewrite any of it.
It holds no input, seed or answer before a call: it maps the scorer's input buffer (and, on CUDA, its
output buffer), answers baseline calls with a built-in function before the import, then calls
`prefix_sum` on the shared input for each request. On the CPU it replies with the address of the
result (the scorer reads it from this process's memory once every solution process is paused); on
CUDA it lends the scorer the allocation holding the result (CUDA IPC) and records an event the scorer
shares after the call's work, without waiting for the device: the scorer's comparison of the result in
place waits for that event. The times it reports are shown to the agent as details only.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path

import torch

from openrebench.api import HostChannel, import_solution, solution_traceback
from openrebench.environments.optimize_kernel._buffers import CpuInput, CudaInput, CudaIpcError, export_result


def _check_output(y: object, x: torch.Tensor) -> str | None:
    if type(y) is not torch.Tensor:
        kind = "a torch.Tensor subclass" if isinstance(y, torch.Tensor) else type(y).__name__
        return f"prefix_sum returned {kind}; it must return a torch.Tensor"
    if y.dtype != x.dtype:
        return f"prefix_sum returned dtype {y.dtype}; expected {x.dtype}"
    if tuple(y.shape) != tuple(x.shape):
        return f"prefix_sum returned shape {tuple(y.shape)}; expected {tuple(x.shape)}"
    if y.device != x.device:
        return f"prefix_sum returned a tensor on {y.device}; expected {x.device}"
    return None


def _import_solution(solution_dir: Path) -> tuple[Callable[[torch.Tensor], object] | None, str | None]:
    module = import_solution(solution_dir)
    if isinstance(module, str):
        return None, module
    fn = getattr(module, "prefix_sum", None)
    if not callable(fn):
        return None, "solution.py does not define a function prefix_sum(x)"
    return fn, None


def _serve(channel: HostChannel, fn: Callable[[torch.Tensor], object], x_buf: torch.Tensor,
           solution_dir: Path, done: torch.cuda.Event | None = None, slot: int = 0) -> str | None:
    """Answer calls until another op arrives; returns that op (None after an error was sent). A "calls"
    request (CUDA) runs k calls, on the k inputs the scorer placed `slot` elements apart, back to back.
    On CUDA the reply goes out without waiting for the device: `done`, an event shared with the scorer,
    is recorded after the last call's work on the current stream, and the scorer's comparison waits
    for it."""
    cuda = x_buf.device.type == "cuda"
    held: list[torch.Tensor] = []  # the results, alive until the scorer has read them
    while True:
        request = channel.receive()
        if request.get("op") == "release":  # freeing the result costs nothing inside a timed window
            held.clear()
            channel.send({"released": True})
            continue
        if request.get("op") not in ("call", "calls"):
            return str(request.get("op"))
        held.clear()  # on CUDA the scorer compared the last results inside its window
        m, k = int(request["n"]), int(request.get("k", 1))
        t0 = time.perf_counter()
        results = []
        for i in range(k):
            x = x_buf[i * slot: i * slot + m]
            try:
                y = fn(x)
            except BaseException as e:
                channel.send({"error": f"prefix_sum raised {solution_traceback(e, solution_dir)}"})
                return None
            if problem := _check_output(y, x):
                channel.send({"error": problem})
                return None
            assert isinstance(y, torch.Tensor)
            results.append(y.contiguous())
        if not cuda:
            held.extend(results)
            channel.send({"addr": results[0].data_ptr(), "host_ms": (time.perf_counter() - t0) * 1e3})
            continue
        wheres = []
        for i, y in enumerate(results):
            try:
                wheres.append(export_result(y))
            except CudaIpcError:  # memory this process cannot lend (e.g. the input itself): a copy it owns
                results[i] = y.clone()
                wheres.append(export_result(results[i]))
        assert done is not None
        done.record()
        held.extend(results)
        channel.send({"cuda": wheres[0] if request.get("op") == "call" else wheres,
                      "host_ms": (time.perf_counter() - t0) * 1e3})


def _baseline(device: torch.device, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The built-in function timed before the import: the identity. On CUDA the result must be memory
    this process owns, so the first call copies the input into a buffer of its own and later calls
    (the scorer repeats one input) return that buffer; each call still runs one tiny kernel, because
    the GPU's switch from the scorer's context to this one and back (about 0.2 ms each way on an H200)
    is part of every real call and belongs to the protocol, not to the solution."""
    if device.type == "cpu":
        return lambda x: x
    own = torch.empty(n, dtype=torch.int32, device=device)
    filled: list[bool] = []

    def identity(x: torch.Tensor) -> torch.Tensor:
        if not filled:
            own[: x.numel()].copy_(x)
            filled.append(True)
        own[:1].add_(0)
        return own[: x.numel()]

    return identity


def main() -> None:
    solution_dir, channel = HostChannel.from_argv()
    setup = channel.receive()
    n = int(setup["n"])
    device = torch.device(setup["device"])
    done = None
    slot = n
    if device.type == "cuda":
        x_buf = CudaInput.open(setup["cuda"], device)
        slot = int(setup.get("slot", n))
        done = torch.cuda.Event(interprocess=True)
    else:
        # Nothing here starts torch's thread pool before the import: OpenMP's threads do not survive a
        # fork, and a solution's worker forked at import (as it may be outside the scorer) would then
        # deadlock in its first multi-threaded operation.
        x_buf = CpuInput.open(int(setup["fd"]), n)
    channel.send({"hello": True, **({"event": base64.b64encode(done.ipc_handle()).decode()} if done else {})})
    if _serve(channel, _baseline(device, n), x_buf, solution_dir, done, slot) != "import":
        return
    start = time.perf_counter()
    fn, problem = _import_solution(solution_dir)
    if fn is None:
        channel.send({"error": problem})
        return
    channel.send({"ready": True, "import_s": time.perf_counter() - start})
    _serve(channel, fn, x_buf, solution_dir, done, slot)


if __name__ == "__main__":
    main()
