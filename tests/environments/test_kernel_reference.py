"""The optimize_kernel reference solution computes exactly what the starting solution does.

The CPU path is checked in this process. The Triton path is checked under Triton's interpreter in a
subprocess, because TRITON_INTERPRET must be set before Triton is first imported.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

ENV_DIR = Path(__file__).resolve().parents[2] / "src" / "openrebench" / "environments" / "optimize_kernel"
REFERENCE = ENV_DIR / "reference" / "solution.py"
STARTING = ENV_DIR / "starting" / "solution.py"


def _load(path: Path, name: str) -> ModuleType:
    """Load a solution file the way the solution host does: by path, outside the package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load(REFERENCE, "reference_solution")
starting = _load(STARTING, "starting_solution")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _check(x: torch.Tensor) -> None:
    original = x.clone()
    y = reference.prefix_sum(x)
    assert type(y) is torch.Tensor and y.dtype == torch.int32 and y.shape == x.shape and y.device == x.device
    assert torch.equal(y, starting.prefix_sum(x))
    assert torch.equal(x, original), "prefix_sum modified its input"


def test_c_library_is_built_where_a_compiler_exists() -> None:
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler on this machine: the PyTorch fallback is what runs")
    assert reference._LIB is not None


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 2**16 + 7, 2**20])
def test_cpu_random(n: int, threads: int) -> None:
    _check(torch.randint(-10, 11, (n,), dtype=torch.int32))


@pytest.mark.parametrize(
    ("low", "high"),
    [(-10, 0), (1, 11), (0, 1), (10, 11)],
    ids=["all-negative", "all-positive", "all-zero", "all-ten"],
)
@pytest.mark.parametrize("n", [1, 100_003, 2**20 + 5])
def test_cpu_edge_cases(n: int, low: int, high: int, threads: int) -> None:
    _check(torch.randint(low, high, (n,), dtype=torch.int32))


def test_cpu_wraps_like_int32_and_takes_non_contiguous_input(threads: int) -> None:
    _check(torch.randint(-(2**31), 2**31, (2**20 + 3,), dtype=torch.int32))
    _check(torch.randint(-10, 11, (2 * 2**20 + 2,), dtype=torch.int32)[::2])


def test_torch_fallback() -> None:
    x = torch.randint(-10, 11, (10_007,), dtype=torch.int32)
    assert torch.equal(reference._prefix_sum_torch(x), starting.prefix_sum(x))


_INTERPRETED_CHECK = textwrap.dedent(
    """
    import importlib.util, sys
    import torch

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    reference, starting = load(sys.argv[1], "reference"), load(sys.argv[2], "starting")
    cases = [(n, -10, 11, {}) for n in (1, 5, 2047, 2049, 3 * 2048 + 17, 20_011)]
    cases += [(n, low, high, {}) for n in (2, 4097) for low, high in ((-10, 0), (1, 11), (0, 1), (10, 11))]
    # Small blocks and chunks, so that the carry kernel walks many chunks.
    cases += [(n, -10, 11, {"block": 256, "chunk": 16}) for n in (255, 256, 257, 20_011)]
    for n, low, high, options in cases:
        x = torch.randint(low, high, (n,), dtype=torch.int32)
        y = reference.prefix_sum_triton(x, **options)
        assert y.dtype == x.dtype and y.shape == x.shape, (n, options)
        assert torch.equal(y, starting.prefix_sum(x)), (n, low, high, options)
    print("checked", len(cases), "inputs")
    """
)


def test_triton_kernels_under_the_interpreter() -> None:
    pytest.importorskip("triton", reason="Triton is not installed: the CUDA path cannot be checked")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_CHECK, str(REFERENCE), str(STARTING)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checked" in result.stdout
