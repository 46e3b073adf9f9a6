"""Exclusive GPU leases: no two attempts hold the same GPU, and a released GPU is free again."""

from __future__ import annotations

import pytest

from openrebench.api import OpenRebenchError
from openrebench.isolation import GpuLease, visible_gpus


def test_leases_are_exclusive_and_released(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENREBENCH_GPUS", "0,1")
    assert visible_gpus() == [0, 1]
    first = GpuLease.acquire(1)
    second = GpuLease.acquire(1)
    assert sorted(first.indices + second.indices) == [0, 1]
    with pytest.raises(OpenRebenchError, match="no 1 free GPU"):
        GpuLease.acquire(1, timeout_s=0.5)
    first.release()
    third = GpuLease.acquire(1, timeout_s=5)
    assert third.indices == first.indices
    second.release()
    third.release()
    assert GpuLease.acquire(2, timeout_s=5).indices == [0, 1]


def test_too_many_gpus_or_a_bad_list_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENREBENCH_GPUS", "0")
    with pytest.raises(OpenRebenchError, match="needs 2 GPU"):
        GpuLease.acquire(2)
    monkeypatch.setenv("OPENREBENCH_GPUS", "zero")
    with pytest.raises(OpenRebenchError, match="not a list of GPU indices"):
        visible_gpus()


def test_a_lease_shows_only_its_own_device_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    monkeypatch.setenv("OPENREBENCH_GPUS", "0,1")
    lease = GpuLease.acquire(1)
    other = 1 - lease.indices[0]
    nodes = lease.device_nodes(tmp_path)
    assert str(tmp_path / f"nvidia{lease.indices[0]}") in nodes
    assert str(tmp_path / f"nvidia{other}") not in nodes
    assert {str(tmp_path / "nvidiactl"), str(tmp_path / "nvidia-uvm")} <= set(nodes)
    lease.release()
