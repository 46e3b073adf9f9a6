"""The solution host: the only process that runs the agent's code.

It builds every input before importing `solution.py`, records the identity of everything the
timing relies on, then serves the scorer's requests: call `prefix_sum` on input i, time it, and
report the time, then digests of the output and of the input. Any exception, wrong type, dtype,
shape or device, left-over thread or tampering is reported as an error message for the agent.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import traceback
from pathlib import Path

import torch

from openrebench.core import HostChannel, TamperGuard
from openrebench.environments.optimize_kernel import _inputs
from openrebench.environments.optimize_kernel._inputs import Digester, make_input

_TIMER_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "time", "sleep")
_TORCH_NAMES = ("randint", "zeros", "zeros_like", "empty", "remainder", "Generator", "Tensor", "device")
_TENSOR_NAMES = ("sum", "to", "reshape", "numel", "__mul__", "tolist", "clone", "__getitem__",
                 "dtype", "shape", "device", "is_contiguous", "contiguous", "detach", "numpy")
_CUDA_NAMES = ("synchronize", "Event", "current_stream", "is_available")


def _solution_traceback(exc: BaseException, solution_dir: Path) -> str:
    """The exception with only the frames in the agent's own files (what they need to debug)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(solution_dir))]
    where = "".join(traceback.format_list(frames[-5:]))
    return f"{type(exc).__name__}: {exc}" + (f"\n{where.rstrip()}" if where else "")


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


def main() -> None:
    solution_dir, channel = HostChannel.from_argv()
    setup = channel.receive()
    device = torch.device(setup["device"])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.init()
    inputs = [make_input(spec, device) for spec in setup["inputs"]]
    digest = Digester(int(setup["digest_seed"]))
    stream = torch.cuda.current_stream() if cuda else None
    if cuda:
        torch.cuda.synchronize()

    guard = (TamperGuard().watch("time", time, _TIMER_NAMES).watch("torch", torch, _TORCH_NAMES)
             .watch("torch.Tensor", torch.Tensor, _TENSOR_NAMES).watch_namespace("the scorer", globals())
             .watch("Digester", Digester, ("__call__", "_w")).watch("the digest", _inputs, ("_blake2b",)))
    if cuda:
        guard.watch("torch.cuda", torch.cuda, _CUDA_NAMES)
        guard.watch("torch.cuda.Event", torch.cuda.Event, ("record", "synchronize", "elapsed_time"))
    perf_counter = time.perf_counter

    start = perf_counter()
    sys.path.insert(0, str(solution_dir))
    path = solution_dir / "solution.py"
    if not path.is_file():
        channel.send({"error": "solution.py is missing from the workspace"})
        return
    try:
        spec = importlib.util.spec_from_file_location("solution", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["solution"] = module
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the agent's code must not end us
        channel.send({"error": f"solution.py failed to import: {_solution_traceback(e, solution_dir)}"})
        return
    fn = getattr(module, "prefix_sum", None)
    if not callable(fn):
        channel.send({"error": "solution.py does not define a function prefix_sum(x)"})
        return
    if problem := guard.check():
        channel.send({"error": f"tampering detected while importing solution.py: {problem}"})
        return
    channel.send({"ready": True, "import_s": perf_counter() - start})

    while True:
        request = channel.receive()
        op = request.get("op")
        if op == "exit":
            return
        if op == "ping":
            channel.send({"pong": True})
            continue
        x = inputs[int(request["i"])]
        try:
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                t0 = perf_counter()
                begin.record(stream)
                y = fn(x)
                torch.cuda.synchronize()  # the whole device: work on side streams counts too
                end.record(stream)
                end.synchronize()
                wall_ms = (perf_counter() - t0) * 1e3
                ms = begin.elapsed_time(end)
            else:
                t0 = perf_counter()
                y = fn(x)
                wall_ms = ms = (perf_counter() - t0) * 1e3
        except BaseException as e:
            channel.send({"error": f"prefix_sum raised {_solution_traceback(e, solution_dir)}"})
            return
        channel.send({"ms": ms, "wall_ms": wall_ms})
        if problem := guard.check():
            channel.send({"error": f"tampering detected while running prefix_sum: {problem}"})
            return
        if threads := guard.new_threads():
            channel.send({"error": f"prefix_sum left threads running ({', '.join(threads)}); "
                                   "all work must be finished when it returns"})
            return
        if problem := _check_output(y, x):
            channel.send({"error": problem})
            return
        channel.send({"digest": digest(y), "input_digest": digest(x), "head": y[:64].tolist()})
        del y


if __name__ == "__main__":
    main()
