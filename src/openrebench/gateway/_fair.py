"""A fair share of a backend among the grants that use it.

Every run's grants share a backend per model spec (one llama.cpp server for all of them, one provider
client per hosted model). Handed requests first come, first served, one run that fills its 16 slots
would make every other run wait behind its queue: another run's scorer, whose calls then time out,
would be scored as if its scaffold failed. So the gateway lets at most `capacity` requests reach a
backend at once, and when one ends, the next goes to the waiting grant that has the fewest requests at
the backend now, and among equals to the one served longest ago (round robin): however many requests
one grant queues, another grant's request waits for at most one request to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict, deque
from collections.abc import AsyncIterator

DEFAULT_CAPACITY = 32
"""Requests at once at a backend that names no capacity of its own (hosted providers take this many)."""


class FairQueue:
    """At most `capacity` holders at once; the next place to the waiting owner holding fewest, then to the
    one served longest ago, then to the earliest waiter."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a backend's capacity is at least 1")
        self.capacity = capacity
        self.active = 0
        self._held: dict[str, int] = defaultdict(int)
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = defaultdict(deque)
        self._order = itertools.count()
        self._served: dict[str, int] = {}  # owner: when it was last handed a place (a count)
        self._turn = itertools.count()

    def holding(self, owner: str) -> int:
        """How many of `owner`'s requests are at the backend now."""
        return self._held.get(owner, 0)

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        """Hold one of the backend's places for `owner` (a grant's id) while the body runs."""
        if self.active < self.capacity and not self.waiting:
            self._take(owner)
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (next(self._order), future)
            self._waiting[owner].append(entry)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._give_back(owner)  # handed a place just as it was cancelled: pass it on
                else:
                    with contextlib.suppress(ValueError):
                        self._waiting[owner].remove(entry)
                    self._tidy(owner)
                raise
        try:
            yield
        finally:
            self._give_back(owner)

    def _take(self, owner: str) -> None:
        self.active += 1
        self._held[owner] += 1
        self._served[owner] = next(self._turn)

    def _give_back(self, owner: str) -> None:
        self.active -= 1
        self._held[owner] -= 1
        if self._held[owner] <= 0:
            del self._held[owner]
            if not self._waiting.get(owner):
                self._served.pop(owner, None)  # nothing left of it here: forget it
        self._hand_on()

    def _tidy(self, owner: str) -> None:
        if not self._waiting.get(owner):
            self._waiting.pop(owner, None)

    def _hand_on(self) -> None:
        while self.active < self.capacity:
            candidates = [(self.holding(o), self._served.get(o, -1), q[0][0], o)
                          for o, q in self._waiting.items() if q]
            if not candidates:
                return
            owner = min(candidates)[-1]
            _, future = self._waiting[owner].popleft()
            self._tidy(owner)
            if future.done():  # its waiter was cancelled
                continue
            self._take(owner)
            future.set_result(None)
