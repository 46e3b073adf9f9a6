"""Shared fixtures: an isolated cache directory and quick ways to make runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from machine_cache import MACHINE_CACHE, kept_folder
from openrebench.runs import Run, start_run

# Tests live in one folder per layer; a few test modules are imported by others for their fakes and
# fixtures (test_gateway's FakeBackend, test_chat_rl_judge's EchoJudge...), by module name, from whichever
# folder runs first: their folders are on the import path from the start, as tests/ is for the support
# modules.
for _layer in ("gateway", "environments"):
    sys.path.insert(0, str(Path(__file__).parent / _layer))

pytest_plugins = ["attempt_support"]  # `attempts`: sandboxes of the example environment, closed at the end

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Parallel workers share the cores: one math thread each for what a test computes in-process (asset
    # builds, training, the judge's tests), or torch's one thread per core in each worker would
    # oversubscribe them. Imported here, since nothing imported so far imports it. Scorer processes keep
    # their default: scores are compared with constants measured that way.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the offline model's files (its GGUF, its PyTorch copy, 800 MB that take 40 s of CPU
    to make) for the whole session and every xdist worker: the machine's own (`<cache>/models`, or
    $OPENREBENCH_MODELS), as `make demo` and every earlier session left it, so that a session makes
    them only on a machine that has none. They are the model's files, verified (the GGUF by its hash) and
    written whole under a lock, the same whoever makes them; a session folder where that one cannot be
    written. Tests of the assembly itself use caches of their own."""
    from openrebench.gateway._local_file import models_dir

    return kept_folder(os.environ.get("OPENREBENCH_MODELS") or models_dir(MACHINE_CACHE), tmp_path_factory)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                   shared_models: Path) -> None:
    """Keep each test's calibration records and assets out of the user's real cache (the offline
    model's files are shared by the session)."""
    monkeypatch.setenv("OPENREBENCH_HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("OPENREBENCH_MODELS", str(shared_models))
    # `openrebench eval` sets these for its attempts in its own process (--resume, --login-user): a test
    # invoking it in-process must not hand them on to the next test in the same worker.
    for name in ("OPENREBENCH_RESUME", "OPENREBENCH_LOGIN_USER"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    # Each test has a home of its own: a machine-dependent tier would calibrate itself in every test that
    # starts a run. tests/runs/test_self_calibration.py turns it on.
    monkeypatch.setenv("OPENREBENCH_SELF_CALIBRATION", "0")
    # Each test is a machine of its own for calibration's lock and its registry of attempts: a test's
    # calibration must neither freeze another test's attempt nor wait for its scorings.
    monkeypatch.setenv("OPENREBENCH_MACHINE_DIR", str(tmp_path_factory.mktemp("machine")))


@pytest.fixture
def kernel_run(tmp_path: Path) -> Run:
    """A mini optimize_kernel run with the starting solution, without the set-up scoring."""
    return start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)[0]
