"""The adversarial suite: each test is one attack on the scoring, asserting the defended behaviour.

Every test carries `@pytest.mark.attack(env=..., cls=..., invariant=N)`: the environment, the attack's
kind, and the invariant of the threat model (docs/threat-model.md) it tries to break (`INVARIANTS`).
An attack whose defence can be switched off in-process also names it (`defence="..."`, see defences.py);
`pytest tests/redteam --defences-off NAME` switches that one defence off for the whole session and runs
only its attacks, which must then work (their assertions fail). The first line of a test's docstring
names the attack. A failing test means the attack currently works (benchmarks/redteam.py tabulates them).
"""

from __future__ import annotations

import pytest
from defences import SWITCHES

INVARIANTS: dict[int, str] = {
    0: "earlier rounds: keys, grants, hidden scores, the score socket",
    1: "no code of the submission runs before or during a measurement it is compared with",
    2: "a pause the paused cannot undo",
    3: "nothing leaves a scoring",
    4: "a judge that an answer unrelated to the question cannot satisfy",
    5: "one row, always, whatever the agent does",
    6: "budgets are hard caps",
    7: "snapshot limits count what is there",
}
_OFF = pytest.StashKey[pytest.MonkeyPatch]()


def defence_of(item: pytest.Item) -> str | None:
    """The defence an attack names, on the test or on one of its parameters (`pytest.param(marks=...)`)."""
    return next((m.kwargs["defence"] for m in item.iter_markers("attack") if m.kwargs.get("defence")), None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--defences-off", default=None, choices=sorted(SWITCHES),
                     help="switch this defence off and run only the attacks it stops (they must work)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "attack(env, cls, invariant, defence=None): an attack on the scoring")
    name = config.getoption("--defences-off", default=None)
    if name:
        patch = pytest.MonkeyPatch()
        SWITCHES[name].switch_off(patch)
        config.stash[_OFF] = patch


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OFF in config.stash:
        config.stash[_OFF].undo()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    off = config.getoption("--defences-off", default=None)
    kept, dropped = [], []
    for item in items:
        if "redteam" not in item.nodeid.split("/"):
            kept.append(item)
            continue
        mark = item.get_closest_marker("attack")
        if mark is None:
            raise pytest.UsageError(f"{item.nodeid} has no @pytest.mark.attack(env=, cls=, invariant=)")
        if mark.kwargs.get("invariant") not in INVARIANTS:
            raise pytest.UsageError(f"{item.nodeid}: invariant= must be one of {sorted(INVARIANTS)}")
        defence = defence_of(item)
        if defence is not None and defence not in SWITCHES:
            raise pytest.UsageError(f"{item.nodeid}: unknown defence {defence!r} (defences.py lists them)")
        (dropped if off and defence != off else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
