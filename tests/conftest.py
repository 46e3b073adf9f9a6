"""Shared fixtures: an isolated cache directory and quick ways to make runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from openrebench.core import Run
from openrebench.environments import get_environment


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep each test's calibration records and assets out of the user's real cache."""
    monkeypatch.setenv("OPENREBENCH_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture
def kernel_run(tmp_path: Path) -> Run:
    """A mini optimize_kernel run with the starting solution, without the set-up scoring."""
    env = get_environment("optimize_kernel")
    run = Run.create(env, "mini", tmp_path / "run")
    env.setup_run("mini", run.workspace, run.protected, tmp_path)
    run.mark_started()
    return run
