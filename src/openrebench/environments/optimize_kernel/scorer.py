"""The optimize_kernel scorer: every call timed and checked from outside the solution's process.

Runs in the scorer process, which the solution cannot reach. For each call (correctness checks and
timed calls alike) the input and its expected output are made here from a fresh seed. On the CPU
every process of the solution stays paused (SIGSTOP, verified per thread) outside its windows: the
input is placed in the buffer the scorer lends to the host while all are paused (inside the window
where no PID namespace guarantees that), the clock starts, they resume for the call, and the clock
stops once the reply has come and all are paused again; only then is the result read from the host's
memory (/proc/PID/mem, opened before the import) and compared. On CUDA the input is copied into the
scorer's IPC buffer inside the window, and the host's result is compared in place (the host lends its
allocation by CUDA IPC) inside the window too, on the same device. A solution's time per call is its
window minus the protocol overhead: the median window of the same protocol run with a built-in
identity function before solution.py was imported, so nothing the solution does can shrink it.
Where the tier names a yardstick (the CPU tier), that time is also adjusted for the machine's current
speed (_yardstick.py). Figures from the host are details only.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from openrebench.api import ScoreResult, SolutionError, SolutionProcess, TierSpec

from ._buffers import CpuInput, CudaInput, CudaIpcError, CudaResults
from ._freeze import Freezer
from ._inputs import expected_array, expected_output, fresh_array, fresh_input
from ._start import Started
from ._yardstick import Yardstick
from .params import KernelParams

if TYPE_CHECKING:
    import torch

MIN_MS = 1e-3  # a solution's time per call is never taken below one microsecond
SAMPLE = 1 << 16  # positions of each GPU result checked inside its window (all are checked after it)


def _checks(n: int) -> list[tuple[str, int, int, int]]:
    """Correctness inputs (label, length, low, high): edge cases, then the tier's full length."""
    mid = min(n, 100_003)
    return [("length 1", 1, -10, 11), ("length 2", 2, -10, 11), ("length 1000", 1000, -10, 11),
            (f"all-negative length {mid}", mid, -10, 0), (f"all-positive length {mid}", mid, 1, 11),
            (f"all-zero length {mid}", mid, 0, 1), (f"random length {mid}", mid, -10, 11),
            (f"random full length {n}", n, -10, 11)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality in one pass (torch.equal is several times slower on a GPU)."""
    import torch

    return not bool(torch.ne(a, b).any())


def _first_mismatch(got: np.ndarray, want: np.ndarray) -> str:
    i = int(np.flatnonzero(got != want)[0])
    return f"first difference at index {i}: got {int(got[i])}, expected {int(want[i])}"


class _Session:
    """One scoring's host, buffers and clock; `call` runs one window and returns its milliseconds."""

    def __init__(self, host: SolutionProcess, buffers: CpuInput | CudaInput, device: torch.device | None,
                 n: int, timeout: float, setup_timeout: float, group: Any | None) -> None:
        """`device` is the GPU's torch device, None on the CPU (where nothing here imports torch)."""
        self.host, self.device, self.timeout = host, device, timeout
        self.cuda = device is not None
        self.freezer = Freezer(group)
        self.mem_fd: int | None = None
        self.cpu = buffers if isinstance(buffers, CpuInput) else None
        self.gpu = buffers if isinstance(buffers, CudaInput) else None
        self.results = CudaResults(device) if self.gpu is not None else None
        self.n = n
        if self.gpu is not None:
            setup: dict[str, Any] = {"device": "cuda", "n": n, "slot": n, "cuda": self.gpu.wire}
        else:
            assert self.cpu is not None
            setup = {"device": "cpu", "n": n, "fd": self.cpu.fd}
        host.send(setup)
        self.nice = os.getpriority(os.PRIO_PROCESS, host.proc.pid)  # before any code of the solution runs
        # Woken first when a reply comes (the host, started before, keeps the ordinary priority): on a
        # busy machine the clock then stops sooner after the call, and the baseline shows the same.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -10)
        hello = host.receive(setup_timeout, "opening the scorer's buffers")
        self.done: torch.cuda.Event | None = None
        if self.gpu is not None:
            import torch

            try:
                self.done = torch.cuda.Event.from_ipc_handle(device, base64.b64decode(hello["event"]))
            except (KeyError, TypeError, ValueError, RuntimeError):
                raise SolutionError("the solution host did not share its completion event") from None
        if not self.cuda:
            # Opened while the host is still ours: reading its memory later needs no further permission.
            self.mem_fd = os.open(f"/proc/{host.proc.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            self.freezer.freeze()

    def _read_host(self, addr: int, count: int) -> np.ndarray:
        assert self.mem_fd is not None
        out = np.empty(count, dtype=np.int32)
        view, done = memoryview(out).cast("B"), 0
        while done < view.nbytes:
            try:
                got = os.preadv(self.mem_fd, [view[done:]], addr + done)
            except (OSError, OverflowError):
                got = 0
            if got <= 0:
                raise SolutionError("the tensor prefix_sum returned could not be read after the call "
                                    "(its memory was unmapped or replaced)")
            done += got
        return out

    def call(self, x: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray,
             label: str) -> tuple[float, dict[str, Any]]:
        """Time one call on `x` (prepared privately: a tensor on the GPU, an array on the CPU) and verify
        it against `want`."""
        m = len(x)
        what = f"prefix_sum on the {label} input"
        if self.gpu is not None:
            import torch

            assert self.results is not None
            shared_in = self.gpu.tensor[:m]
            torch.cuda.synchronize(self.device)  # this call's input and answer are made: none of it is timed
            t0 = time.perf_counter()
            shared_in.copy_(x)
            torch.cuda.synchronize(self.device)
            reply = self.host.request({"op": "call", "n": m}, self.timeout, what)
            try:
                got = self.results.view(reply, m)
            except (CudaIpcError, ValueError) as e:
                raise SolutionError(f"the result of prefix_sum could not be read ({e})") from None
            # Compared in place, inside the window, after the host's event: replying before the work is
            # done gains nothing (no process waits for the device before the comparison, honest or not),
            # and work the event does not cover is still running when the result is read.
            assert self.done is not None
            self.done.wait()
            correct = _same(got, want)
            ms = (time.perf_counter() - t0) * 1e3
            if not _same(shared_in, x):
                raise SolutionError(f"prefix_sum modified its input ({label} input); it must not")
            if not correct:
                raise SolutionError(f"wrong output for the {label} input: "
                                    f"{_first_mismatch(got.cpu().numpy(), want.cpu().numpy())}")
            return ms, reply
        assert self.cpu is not None
        shared_in = self.cpu.array[:m]
        if self.freezer.namespace:
            # Every process of the solution is verified stopped and none can be started: the input may
            # be placed before the clock starts, since nothing can read it before the call.
            np.copyto(shared_in, x)
            t0 = time.perf_counter()
        else:
            t0 = time.perf_counter()
            np.copyto(shared_in, x)
        reply = self._resumed({"op": "call", "n": m}, self.timeout, what)
        ms = (time.perf_counter() - t0) * 1e3
        addr = reply.get("addr")
        if type(addr) is not int or addr <= 0:
            raise SolutionError("the solution host replied without the address of its result")
        if not np.array_equal(shared_in, x):
            raise SolutionError(f"prefix_sum modified its input ({label} input); it must not")
        got, expected = self._read_host(addr, m), np.asarray(want)
        if not np.array_equal(got, expected):
            raise SolutionError(f"wrong output for the {label} input: {_first_mismatch(got, expected)}")
        self.request({"op": "release"}, self.timeout, "releasing the result")
        return ms, reply

    def window(self, xs: list[torch.Tensor], wants: list[torch.Tensor],
               label: str) -> tuple[float, dict[str, Any]]:
        """Time k calls together on the GPU, each on its own fresh input (`xs`, prepared privately), and
        return the window's milliseconds per call. Inside the window: the inputs are copied in, the host
        runs the k calls back to back, and once its event has passed every result is checked at a fresh
        random sample of positions, so that work left running on another stream is caught unfinished
        (or was finished inside the window). Every result is then checked whole, outside the window."""
        import torch

        assert self.gpu is not None and self.results is not None and self.done is not None
        k, m = len(xs), xs[0].numel()
        slots = [self.gpu.tensor[i * self.n: i * self.n + m] for i in range(k)]
        sample = torch.randint(0, m, (min(m, SAMPLE),), device=self.device)
        expected = [w[sample] for w in wants]
        what = f"prefix_sum on the {label} inputs"
        torch.cuda.synchronize(self.device)  # the inputs and answers are made: none of it is timed
        t0 = time.perf_counter()
        for slot, x in zip(slots, xs, strict=True):
            slot.copy_(x)
        torch.cuda.synchronize(self.device)
        reply = self.host.request({"op": "calls", "k": k, "n": m}, self.timeout * k, what)
        wheres = reply.get("cuda")
        if not isinstance(wheres, list) or len(wheres) != k:
            raise SolutionError("the solution host did not say where each result is")
        try:
            gots = [self.results.view({"cuda": w}, m) for w in wheres]
        except (CudaIpcError, ValueError) as e:
            raise SolutionError(f"the result of prefix_sum could not be read ({e})") from None
        self.done.wait()
        sampled = all(_same(g[sample], e) for g, e in zip(gots, expected, strict=True))
        ms = (time.perf_counter() - t0) * 1e3
        for i, (slot, x, got, want) in enumerate(zip(slots, xs, gots, wants, strict=True)):
            if not _same(slot, x):
                raise SolutionError(f"prefix_sum modified its input ({label} input {i + 1}); it must not")
            if not _same(got, want):
                raise SolutionError(f"wrong output for the {label} input {i + 1}: "
                                    f"{_first_mismatch(got.cpu().numpy(), want.cpu().numpy())}")
        if not sampled:
            raise SolutionError(f"the results of the {label} calls were not finished when the current "
                                "stream's work was (work left on another stream must be joined to the "
                                "current one before prefix_sum returns)")
        return ms / k, reply

    def _resumed(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        """Send a request, let the solution's processes run until the reply, pause them all again.
        The message goes first: the host finds it waiting when it wakes (one switch fewer)."""
        self.host.send(message)
        self.freezer.resume()
        reply = self.host.receive(timeout, what)
        self.freezer.freeze()
        return reply

    def request(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        """A request outside the timed calls (e.g. the import)."""
        if self.cuda:
            return self.host.request(message, timeout, what)
        return self._resumed(message, timeout, what)

    def close(self) -> None:
        if self.freezer.group is not None:
            with contextlib.suppress(OSError):
                self.freezer.kill_all()
        if self.results is not None:
            self.results.close()
        if self.mem_fd is not None:
            os.close(self.mem_fd)


def score(spec: TierSpec[KernelParams], solution: Path, started: Started) -> ScoreResult:
    """Score with the host `started` (`_start.host_started`, which started it before this module
    imported torch)."""
    if started.result is not None:
        return started.result
    host, group = started.host, started.group
    assert host is not None
    p = spec.params
    n, warmup, timed, per_window = p.length, p.warmup_calls, p.timed_calls, p.calls_per_window
    device = None  # the CPU: arrays, and no torch in this process
    if spec.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            return ScoreResult.invalid(f"Invalid: the {spec.name} tier needs a CUDA GPU and none is "
                                       "available.")
        device = torch.device(spec.device)
    timeout = p.call_timeout_s
    yardstick = p.yardstick if device is None else None
    yard: Yardstick | None = None
    phases: dict[str, float] = {}  # seconds each phase of the scoring took: where a slow scoring goes
    clock = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - clock[0], 3)
        clock[0] = now

    def fresh(size: int, low: int, high: int) -> Any:
        """An input from a seed drawn now: a tensor on the GPU, an array on the CPU."""
        return fresh_array(size, low, high) if device is None else fresh_input(size, low, high, device)

    def prepared(size: int, low: int, high: int) -> tuple[Any, Any]:
        """An input and its answer."""
        x = fresh(size, low, high)
        return x, expected_array(x) if device is None else expected_output(x)

    # The host was started first: it imports torch while this process initialises CUDA.
    buffers: CpuInput | CudaInput | None = None
    session: _Session | None = None
    try:
        if started.input_fd is not None:
            buffers = CpuInput(started.input_fd, n)
        else:
            assert device is not None
            buffers = CudaInput(n * per_window, device)
        phase("start")
        session = _Session(host, buffers, device, n, timeout, p.setup_timeout_s, group)
        # The protocol's own cost, measured before the solution exists (the identity's output is its
        # input), where the tier subtracts it.
        x = fresh(n, -10, 11)
        baseline = [session.call(x, x, "baseline")[0] for _ in range(p.baseline_calls)]
        overhead = statistics.median(baseline) if baseline else 0.0
        phase("host_ready")
        if yardstick is not None:
            yard = Yardstick(yardstick.length, session.nice)
            yard.run("before", yardstick.block)
        session.request({"op": "import"}, p.setup_timeout_s, "importing solution.py")
        phase("import")
        for label, size, low, high in _checks(n):
            session.call(*prepared(size, low, high), label)
        phase("checks")
        windows, host_ms = [], []
        for k in range(warmup + timed):
            if device is not None:
                xs, wants = zip(*(prepared(n, -10, 11) for _ in range(per_window)), strict=True)
                phase("inputs")
                ms, reply = session.window(list(xs), list(wants), f"timing #{k + 1}")
                phase("windows")
                del xs, wants
                windows.append(ms)
                with contextlib.suppress(TypeError, ValueError):
                    host_ms.append(float(reply.get("host_ms")) / per_window)  # type: ignore[arg-type]
                continue
            # The warm-up calls share one input (their times are not counted; only the timed calls
            # need inputs no call has seen): 19 fewer inputs and answers to make, about 1 s.
            if k >= warmup or k == 0:
                x, want = prepared(n, -10, 11)
            if yard is not None and k >= warmup:  # every process of the solution is paused here
                yard.run("between")
            ms, reply = session.call(x, want, f"timing #{k + 1}")
            windows.append(ms)
            with contextlib.suppress(TypeError, ValueError):
                host_ms.append(float(reply.get("host_ms")))  # type: ignore[arg-type]
        phase("windows")
    except SolutionError as e:
        return ScoreResult.invalid(f"Invalid: {e}")
    finally:
        host.close()  # every process of the solution ends here, before the yardstick's last block
        if session is not None:
            session.close()
        if buffers is not None:
            buffers.close()
        phase("close")
    speed = None
    if yard is not None and yardstick is not None and session is not None:
        # Every process of the solution is gone now; the scorer can tell only inside its PID namespace.
        yard.run("after", yardstick.block)
        speed = _speed(yard, yardstick.ms, session.freezer.namespace)
    result = _result(n, str(device or "cpu"), timed, windows[warmup:], baseline, overhead, host_ms[warmup:],
                     speed, per_window)
    result.details["phases_s"] = phases
    return result


def _speed(yard: Yardstick, at_calibration: float, after_trusted: bool) -> dict[str, Any]:
    now = yard.current_ms(after_trusted)
    return {"ms": now, "ms_at_calibration": at_calibration, "factor": at_calibration / now,
            "length": int(yard.x.size), "after_trusted": after_trusted,
            **{f"{phase}_ms": times for phase, times in yard.times.items()}}


def _result(n: int, device: str, timed: int, windows: list[float], baseline: list[float],
            overhead: float, host_ms: list[float], speed: dict[str, Any] | None = None,
            per_window: int = 1) -> ScoreResult:
    ms = [max(w - overhead, MIN_MS) for w in windows]
    median_ms = statistics.median(ms)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [0.0, 0.0, 0.0]
    details = {"length": n, "device": device, "median_ms": median_ms, "times_ms": ms,
               "windows_ms": windows, "overhead_ms": overhead, "baseline_ms": baseline,
               "host_reported_ms": host_ms, "calls_per_window": per_window,
               "spread_ms": {"min": min(ms), "max": max(ms), "iqr": q[2] - q[0]}}
    counted, speed_note = median_ms, ""
    if speed is not None:
        counted = max(median_ms * speed["factor"], MIN_MS)
        details.update(adjusted_ms=counted, yardstick=speed)
        speed_note = (f"; the yardstick took {speed['ms']:.2f} ms in this scoring against "
                      f"{speed['ms_at_calibration']:.2f} ms at calibration, so the time counts as "
                      f"{counted:.3f} ms")
    raw = math.log(counted)
    how = (f"protocol overhead {overhead:.3f} ms subtracted" if baseline else
           f"windows of {per_window} calls, each timed whole, nothing subtracted")
    calls = f"{timed} calls" if per_window == 1 else f"{timed} windows of {per_window} calls"
    return ScoreResult(raw=raw, details=details, message=(
        f"Valid: correct on {len(_checks(n))} inputs; median {median_ms:.3f} ms per call over {calls} at "
        f"length {n:,} (min {min(ms):.3f}, max {max(ms):.3f}; timed by the scorer, {how})"
        f"{speed_note}; score ln(ms) = {raw:.4f}"))

