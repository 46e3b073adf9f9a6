"""The adversarial suite: each test is one attack on the scoring, asserting the defended behaviour.

Every test carries `@pytest.mark.attack(env=..., cls=...)`; the first line of its docstring names the
attack. A failing test means the attack currently works (benchmarks/redteam.py tabulates them).
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "attack(env, cls): an attack on the scoring")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "redteam" in item.nodeid.split("/") and item.get_closest_marker("attack") is None:
            raise pytest.UsageError(f"{item.nodeid} has no @pytest.mark.attack(env=..., cls=...)")
