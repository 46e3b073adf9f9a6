"""Pausing every process of the solution, so that nothing it started runs outside a timed window.

The solution host starts inside a cgroup of its own (the one the harness made for this scoring, or one
the scorer makes): every process it or its descendants start is in that group, whatever they do
(double forks, new sessions, re-parenting, a zombie leader with live threads), and none can leave it. A
pause is the cgroup freezer: atomic (nothing can fork or run while the group freezes) and not undone by
anything inside (SIGCONT, a signal handler, ptrace). There is no fallback: a timing scoring without a
freezer is refused (see scorer.py), since a pause made of signals is one a solution can undo.
"""

from __future__ import annotations

from typing import Any

from openrebench.api import SolutionError


class Freezer:
    """The solution's cgroup, frozen and thawed around each timed window."""

    namespace = True  # every process of the solution is in the group: a frozen group is all of it

    def __init__(self, group: Any) -> None:
        self.group = group

    def processes(self) -> list[int]:
        """Every process of the solution that exists now."""
        return sorted(self.group.pids())

    def freeze(self, timeout: float = 5.0) -> None:
        """Return once every task of the solution is frozen; SolutionError otherwise (a task stuck in the
        kernel, say)."""
        try:
            frozen = self.group.freeze(timeout_s=timeout)
        except OSError as e:
            raise SolutionError(f"the solution's processes could not be paused ({e})") from None
        if not frozen:
            raise SolutionError(f"the solution's processes could not all be paused within {timeout:g} s")

    def resume(self) -> None:
        try:
            self.group.thaw()
        except OSError as e:
            raise SolutionError(f"the solution's processes could not be resumed ({e})") from None

    def kill_all(self) -> None:
        """End everything the solution started (frozen, killed, thawed so that the kills land)."""
        self.group.kill_all()
