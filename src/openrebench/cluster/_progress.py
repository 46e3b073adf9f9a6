"""Live progress of a cluster eval: attempts per environment and state, and the cluster's free
resources. `display`: None or `full`/`rich` (a live table), `plain` (a line when the counts change, at
most every PLAIN_EVERY_S), `none` (nothing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ._queue import STATES, AttemptQueue

PLAIN_EVERY_S = 10.0
LABELS = {"queued": "queued", "waiting": "waiting for GPUs", "running": "running", "done": "done",
          "failed": "failed"}


class Progress:
    def __init__(self, display: str | None, queue: AttemptQueue, cluster: Callable[[], str],
                 console: Console | None = None) -> None:
        plain = display in ("plain", "conversation")
        self.mode = "none" if display == "none" else "plain" if plain else "live"
        self.queue = queue
        self.cluster = cluster
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._last: tuple[object, ...] | None = None
        self._last_at = 0.0

    def __enter__(self) -> Progress:
        if self.mode == "live":
            self._live = Live(self.render(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(kind, error, tb)

    def table(self) -> Table:
        counts = self.queue.counts()
        table = Table(title="openrebench eval on the cluster", title_justify="left")
        table.add_column("environment")
        for state in STATES:
            table.add_column(LABELS[state], justify="right")
        totals = dict.fromkeys(STATES, 0)
        for env_id, by_state in counts.items():
            table.add_row(env_id, *(str(by_state.get(s, 0)) for s in STATES))
            for s in STATES:
                totals[s] += by_state.get(s, 0)
        if len(counts) > 1:
            table.add_row("all", *(str(totals[s]) for s in STATES), style="bold")
        return table

    def render(self) -> Group:
        return Group(self.table(), Text(self.cluster()))

    def update(self) -> None:
        if self.mode == "live" and self._live is not None:
            self._live.update(self.render())
        elif self.mode == "plain":
            counts = self.queue.counts()
            key = tuple(sorted((e, tuple(sorted(c.items()))) for e, c in counts.items()))
            now = time.monotonic()
            if key != self._last and now - self._last_at >= PLAIN_EVERY_S:
                self._last, self._last_at = key, now
                total = {s: sum(c.get(s, 0) for c in counts.values()) for s in STATES}
                line = ", ".join(f"{total[s]} {LABELS[s]}" for s in STATES)
                self.console.print(f"{line} | {self.cluster()}", highlight=False, soft_wrap=True)
