"""Honest optimize_kernel solutions built the ways people build fast code stay valid under the scorer's
protocol (every solution process in one cgroup, frozen between calls): a thread pool, a worker process
that lives across calls (fed bytes through a pipe, or the input tensor itself through
torch.multiprocessing), and torch.compile. Each is scored on the short in-process tier
(kernel_support) and must be correct and valid."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from kernel_support import KERNEL_PARAMS, KERNEL_TIER, kernel_score

CORE = textwrap.dedent("""
    import torch

    def _exact(x):
        odd = torch.zeros_like(x, dtype=torch.int64)
        odd[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
        return (x.to(torch.int64) * odd).cumsum(0).to(torch.int32)
""")

SOLUTIONS = {
    "a thread pool": CORE + textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(2)

        def prefix_sum(x):
            # the parity and the products in two threads, the sums in this one
            odd_f = _POOL.submit(lambda: (x[:-1] > 0).to(torch.int64).cumsum(0) % 2)
            wide_f = _POOL.submit(lambda: x.to(torch.int64))
            odd = torch.zeros_like(x, dtype=torch.int64)
            odd[1:] = odd_f.result()
            return (wide_f.result() * odd).cumsum(0).to(torch.int32)
    """),
    "a worker process across calls": CORE + textwrap.dedent("""
        import multiprocessing as mp

        def _serve(conn):
            while True:
                x = torch.frombuffer(bytearray(conn.recv_bytes()), dtype=torch.int32)
                conn.send_bytes(_exact(x).numpy().tobytes())

        _ctx = mp.get_context("fork")
        _mine, _theirs = _ctx.Pipe()
        _worker = _ctx.Process(target=_serve, args=(_theirs,), daemon=True)
        _worker.start()

        def prefix_sum(x):
            _mine.send_bytes(x.numpy().tobytes())
            return torch.frombuffer(bytearray(_mine.recv_bytes()), dtype=torch.int32)
    """),
    "a worker process fed tensors by torch.multiprocessing": CORE + textwrap.dedent("""
        import torch.multiprocessing as tmp

        def _serve(inbox, outbox):
            while True:
                outbox.put(_exact(inbox.get()))

        _ctx = tmp.get_context("fork")
        _inbox, _outbox = _ctx.Queue(), _ctx.Queue()
        _worker = _ctx.Process(target=_serve, args=(_inbox, _outbox), daemon=True)
        _worker.start()

        def prefix_sum(x):
            _inbox.put(x)  # the input's own pages, shared, not copied
            return _outbox.get().clone()
    """),
    "torch.compile": CORE + textwrap.dedent("""
        _compiled = torch.compile(_exact, dynamic=False)
        _compiled(torch.randint(-5, 5, (2**15,), dtype=torch.int32))  # compiled at import, not in a call

        def prefix_sum(x):
            return _compiled(x)
    """),
}


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_an_honest_solution_built_this_way_scores_validly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          name: str) -> None:
    if "worker process" in name and KERNEL_TIER == "full":
        pytest.skip("a CPU design: a forked worker cannot use CUDA, and the bytes of a CUDA tensor are not "
                    "at hand without a copy to the host")
    if name == "torch.compile" and shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    # Long enough that torch runs its element-wise operations on several threads (above its grain of
    # 32,768): a worker forked after the host had started them would deadlock in its first such call.
    length = 2**17 if KERNEL_TIER == "mini" else KERNEL_PARAMS["length"]
    result = kernel_score(monkeypatch, tmp_path, SOLUTIONS[name], setup_timeout_s=300, length=length)
    assert result.raw is not None and result.message.startswith("Valid"), result.message
    assert result.details["median_ms"] > 0
