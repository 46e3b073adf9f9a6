"""Attacks on optimize_kernel's timing: each one either gets an invalid row or gains nothing.

The honest work in these solutions is 100 ms of sleep plus an exact NumPy computation, so an attack
that let any of that escape the timed window would show as a median far below 100 ms.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernel_support import kernel_score
from openrebench.runs import Run, ScoreRow, score_run

HONEST = textwrap.dedent("""
    import time
    import numpy as np
    import torch

    def honest_np(a):
        time.sleep(0.1)  # stands for 100 ms of real work
        odd = np.zeros(a.size, np.int32)
        odd[1:] = np.cumsum(a[:-1] > 0, dtype=np.int32) & 1
        return np.cumsum(a * odd, dtype=np.int32)

    def honest(x):
        return torch.from_numpy(honest_np(x.numpy()))
""")

ATTACKS: dict[str, str] = {
    # The host once built every input before the import: look for them (or anything else) in memory.
    "precomputes from the host's memory at import": HONEST + textwrap.dedent("""
        import gc, sys
        candidates = [t.clone() for t in gc.get_objects()
                      if type(t) is torch.Tensor and t.dtype == torch.int32 and t.numel() > 0]
        frame = sys._getframe()
        while frame is not None:
            candidates += [v.clone() for v in frame.f_locals.values()
                           if type(v) is torch.Tensor and v.dtype == torch.int32 and v.numel() > 0]
            frame = frame.f_back
        answers = [(c, honest(c)) for c in candidates]

        def prefix_sum(x):
            for c, y in answers:
                if c.numel() >= x.numel() and torch.equal(c[:x.numel()], x):
                    return y[:x.numel()].clone()
            return honest(x)
    """),
    # Fake every time the host reports, slow every message but the results, and disable the old guard.
    "patches the channel, the guard and the clock": HONEST + textwrap.dedent("""
        import sys
        import openrebench.api._protocol as protocol
        from openrebench.api import HostChannel, TamperGuard
        _write = protocol.write_message

        def write(fd, message):
            if "addr" not in message:
                time.sleep(0.02)
            _write(fd, {**message, "ms": 1e-6, "wall_ms": 1e-6, "host_ms": 1e-6})

        protocol.write_message = write
        HostChannel.send = lambda self, message: write(self.write_fd, message)
        TamperGuard.check = lambda self: None
        time.perf_counter = lambda: 0.0
        sys.setprofile(lambda *a: None)

        def prefix_sum(x):
            return honest(x)
    """),
    # Start computing as soon as the input appears in the shared buffer, before the call is made.
    "watches the input buffer ahead of the call": HONEST + textwrap.dedent("""
        import threading
        state = {"buf": None, "answer": None}
        ready = threading.Condition()

        def watch():
            last = None
            while True:
                buf = state["buf"]
                if buf is None:
                    time.sleep(0.0005)
                    continue
                head = bytes(buf[:256].numpy())
                if head == last:
                    time.sleep(0.0005)
                    continue
                last = head
                snapshot = buf.clone()
                answer = honest(snapshot)
                with ready:
                    state["answer"] = (snapshot, answer)
                    ready.notify_all()

        threading.Thread(target=watch, daemon=True).start()

        def prefix_sum(x):
            if state["buf"] is None:
                state["buf"] = torch.empty(0, dtype=torch.int32).set_(x.untyped_storage())
            n = x.numel()
            with ready:
                for _ in range(200):
                    got = state["answer"]
                    if got is not None and torch.equal(got[0][:n], x):
                        return got[1][:n].clone()
                    ready.wait(0.01)
            return honest(x)
    """),
}

EARLY: dict[str, str] = {
    # Return at once and finish the result in a thread afterwards.
    "replies early, a thread finishes the work": HONEST + textwrap.dedent("""
        import threading

        def prefix_sum(x):
            y = torch.zeros_like(x)
            threading.Thread(target=lambda: y.copy_(honest(x)), daemon=True).start()
            return y
    """),
}

_FORKED = HONEST + textwrap.dedent("""
    import ctypes, mmap, os, struct
    N = 1 << 23
    shared = mmap.mmap(-1, 4 * N)
    out = np.frombuffer(shared, dtype=np.int32, count=N)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if DOUBLE:
            os.setsid()
            if os.fork():
                os._exit(0)
        os.close(w)
        while True:
            message = os.read(r, 16)
            if len(message) < 16:
                os._exit(0)
            addr, n = struct.unpack("qq", message)
            a = np.frombuffer(ctypes.string_at(addr, 4 * n), dtype=np.int32)
            out[:n] = honest_np(a)
    if DOUBLE:
        os.waitpid(pid, 0)
    os.close(r)

    def prefix_sum(x):
        os.write(w, struct.pack("qq", x.data_ptr(), x.numel()))
        return torch.from_numpy(out[:x.numel()])
""")
EARLY["replies early, a child process writes the result"] = "DOUBLE = False\n" + _FORKED
EARLY["replies early, a double-forked daemon writes the result"] = "DOUBLE = True\n" + _FORKED


def _valid_without_gain(row: ScoreRow) -> None:
    assert row.raw is not None, row.message
    assert row.details["median_ms"] >= 90, row.message


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_gains_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """In this process on a short input (the host is the real one): each timed call is still 100 ms of
    honest work, which is what an attack would have to hide (pausing without a PID namespace scans all
    of /proc, so the subtracted overhead here is tens of ms, and as noisy)."""
    result = kernel_score(monkeypatch, tmp_path, ATTACKS[name])
    assert result.raw is not None, result.message
    assert result.details["median_ms"] >= 75, result.message  # hiding the 100 ms would give a few ms


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EARLY))
def test_work_left_running_after_the_reply_is_not_seen(kernel_run: Run, name: str) -> None:
    (kernel_run.workspace / "solution.py").write_text(EARLY[name])
    row = score_run(kernel_run, timeout_s=240)
    assert row.raw is None and "wrong output for the" in row.message, row.message


@pytest.mark.slow
def test_sandboxed_scoring_reads_results_and_pauses_daemons(kernel_run: Run) -> None:
    """In the bubblewrap sandbox the solution runs as another uid than the scorer: an honest solution
    is read and timed, and a double-forked daemon is paused with the rest."""
    from openrebench.isolation import bwrap_usable

    if bwrap_usable():
        pytest.skip(f"no scoring sandbox: {bwrap_usable()}")
    (kernel_run.workspace / "solution.py").write_text(HONEST + "\ndef prefix_sum(x):\n    return honest(x)\n")
    _valid_without_gain(score_run(kernel_run, timeout_s=240, sandboxed=True))
    name = "replies early, a double-forked daemon writes the result"
    (kernel_run.workspace / "solution.py").write_text(EARLY[name])
    row = score_run(kernel_run, timeout_s=240, sandboxed=True)
    assert row.raw is None and "wrong output for the" in row.message, row.message
