"""Build progress inside an Inspect eval: a counter in the footer of Inspect's task display.

A sample's run is set up in a worker thread (`anyio.to_thread`), while Inspect's display lives on the
event loop's thread (Textual is not thread-safe) and throttles its redraws with background tasks; so
each update goes to the loop as a task in the sample's context, where Inspect's own updates run. Only
the `full`, `conversation` and `rich` displays show counters (`plain` ignores them, `log` would log
every update); stages that begin and end are logged at info level whatever the display.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable

from openrebench.api import StageUpdate

CAPTION = "set-up"
SHOWN_BY = ("full", "conversation", "rich")

logger = logging.getLogger(__name__)


def _inspect_counter(caption: str, value: str) -> None:
    from inspect_ai.util import display_counter, display_type

    if display_type() in SHOWN_BY:
        display_counter(caption, value)


class InspectProgress:
    """A progress sink for `openrebench.api.reporting` that shows the latest stage in Inspect's footer
    ("set-up: mini corpus › tokenising 12/40"), and what was built once it is done."""

    def __init__(self, counter: Callable[[str, str], None] = _inspect_counter) -> None:
        self.counter = counter
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._thread = threading.get_ident()
        self._context = contextvars.copy_context()
        self._announced: set[int] = set()

    def __call__(self, u: StageUpdate) -> None:
        from rich.markup import escape

        if u.done and len(u.path) == 1:
            value = f"{u.what} {'stopped' if u.failed else '✓'} {u.elapsed_s:.0f} s"
            ended = "stopped building" if u.failed else "built"
            logger.info("%s %s after %.1f s", ended, u.what, u.elapsed_s)
        elif u.done:
            value = " › ".join(u.path[:-1])
        else:
            value = f"{u.label} {u.count}".rstrip()
            if len(u.path) == 1 and u.id not in self._announced:
                self._announced.add(u.id)
                logger.info("building %s", u.what)
        self._show(escape(value))  # the footer is rich markup

    def _show(self, value: str) -> None:
        if self._loop is None or threading.get_ident() == self._thread:
            self.counter(CAPTION, value)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._spawn, value)

    def _spawn(self, value: str) -> None:
        assert self._loop is not None
        self._loop.create_task(self._update(value), context=self._context.copy())

    async def _update(self, value: str) -> None:
        try:
            self.counter(CAPTION, value)
        except Exception:  # the footer is a nicety: never an error in the eval
            logger.debug("could not update Inspect's footer", exc_info=True)
