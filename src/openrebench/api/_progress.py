"""Progress of long work (asset builds): builders say what they do and how far they are; the entry
point decides where it shows.

A builder opens a `stage("tokenising", total=n)` and moves it on; stages opened inside another belong to
it. Reports go to the sink that the caller made active with `reporting(sink)`: the CLI's rich bars on
stderr (`show_progress`), Inspect's task display (`openrebench.harness`), or nothing at all in a
library call or a test, where a stage costs a clock read per update. The active sink and the current
stage are context variables, so they follow the work into threads started with a copy of the context
(`anyio.to_thread`, `asyncio.to_thread`). A cached build opens no stage and so says nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

logger = logging.getLogger(__name__)
THROTTLE_S = 0.2  # at most five updates a second per stage (a CPU training step can take a millisecond)


@dataclass(frozen=True)
class StageUpdate:
    """One report of a stage: it began (`n` where it starts), moved on, or ended (`done`; `failed` when an
    exception or an interruption ended it)."""

    id: int
    path: tuple[str, ...]  # the labels of the stages it belongs to, then its own
    n: int
    total: int | None
    done: bool
    elapsed_s: float
    failed: bool = False

    @property
    def what(self) -> str:
        return self.path[-1]

    @property
    def label(self) -> str:
        """What is going on, in one line: "mini corpus › tokenising"."""
        return " › ".join(self.path)

    @property
    def count(self) -> str:
        return f"{self.n:,}/{self.total:,}" if self.total is not None else ""


Sink = Callable[[StageUpdate], None]

_sink: ContextVar[Sink | None] = ContextVar("openrebench_progress_sink", default=None)
_current: ContextVar[Stage | None] = ContextVar("openrebench_progress_stage", default=None)
_ids = itertools.count(1)


class Stage:
    """A step of long work: `advance()` or `update(n)` as it goes; the sink sees at most one report per
    THROTTLE_S, always the first and the last, and the latest before a stage inside it begins (so that
    a label changed just before, "experiment 3", is not shown late)."""

    def __init__(self, what: str, total: int | None, n: int, sink: Sink | None, parent: Stage | None) -> None:
        self.id, self.sink, self.total, self.n = next(_ids), sink, total, n
        self.path = (*parent.path, what) if parent else (what,)
        self.started = self._last = time.monotonic()
        self._unsent, self.failed = False, False

    def advance(self, k: int = 1) -> None:
        self.update(self.n + k)

    def update(self, n: int | None = None, *, total: int | None = None, what: str | None = None) -> None:
        if n is not None:
            self.n = n
        if total is not None:
            self.total = total
        if what is not None:
            self.path = (*self.path[:-1], what)
        self._unsent = True
        if self.sink is not None and time.monotonic() - self._last >= THROTTLE_S:
            self._emit(done=False)

    def _emit(self, done: bool) -> None:
        if self.sink is not None:
            self._last, self._unsent = time.monotonic(), False
            update = StageUpdate(self.id, self.path, self.n, self.total, done, self._last - self.started,
                                 failed=self.failed)
            try:
                self.sink(update)
            except Exception:  # a display that fails must not stop the work it shows
                logger.warning("progress display failed; carrying on without it", exc_info=True)
                self.sink = None


@contextlib.contextmanager
def stage(what: str, total: int | None = None, *, n: int = 0) -> Iterator[Stage]:
    """Report a step of long work (`what`, and `n` of `total` when known) to the active sink, if any."""
    parent = _current.get()
    if parent is not None and parent._unsent:
        parent._emit(done=False)
    s = Stage(what, total, n, _sink.get(), parent)
    token = _current.set(s)
    s._emit(done=False)
    try:
        yield s
    except BaseException:
        s.failed = True
        raise
    finally:
        _current.reset(token)
        s._emit(done=True)


@contextlib.contextmanager
def reporting(sink: Sink) -> Iterator[None]:
    """Send the stages opened inside (here and in threads that copy this context) to `sink`."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


def progress_active() -> bool:
    return _sink.get() is not None


class RichProgress:
    """Stages as rich progress bars (what, bar, n/total, elapsed), each under the stage it belongs to.
    A finished inner stage is removed, a finished outer one stays as a record of what was built and how
    long it took. On a console that is not a terminal (a log file) it writes one line as each outer
    stage or its direct steps start and end instead."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._tasks: dict[int, TaskID] = {}
        self._announced: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, u: StageUpdate) -> None:
        with self._lock:
            if self.console.is_terminal:
                self._bar(u)
            elif len(u.path) <= 2 and (u.done or u.id not in self._announced):
                self._announced.add(u.id)
                self._line(u)

    def _bar(self, u: StageUpdate) -> None:
        from rich.markup import escape
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        if self._progress is None:
            self._progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                                      TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                      console=self.console)
            self._progress.start()
        description = "  " * (len(u.path) - 1) + escape(u.what)
        task = self._tasks.get(u.id)
        if task is None:
            task = self._tasks[u.id] = self._progress.add_task(description, total=u.total, completed=u.n,
                                                               count=u.count)
        else:
            self._progress.update(task, description=description, total=u.total, completed=u.n, count=u.count)
        if u.done:
            if len(u.path) > 1:
                self._progress.remove_task(task)
            elif u.failed:
                self._progress.update(task, description=f"{description} [red](stopped)[/]")
                self._progress.stop_task(task)
            else:
                full = max(u.n, u.total or 0, 1)
                self._progress.update(task, total=full, completed=full)
                self._progress.stop_task(task)

    def _line(self, u: StageUpdate) -> None:
        indent = "  " * (len(u.path) - 1)
        if u.done:
            count = f" {u.count}" if u.count else ""
            end = "stopped after" if u.failed else "done in"
            self.console.print(f"{indent}{u.what}:{count} {end} {u.elapsed_s:.1f} s", highlight=False,
                               markup=False)
        else:
            self.console.print(f"{indent}{u.what}…", highlight=False, markup=False)

    def close(self) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None


@contextlib.contextmanager
def show_progress(console: Console | None = None) -> Iterator[None]:
    """Show the stages of the work inside as rich bars on `console` (default: stderr). Pass the console
    of any live display already running (a status spinner) so that the two share it."""
    display = RichProgress(console)
    try:
        with reporting(display):
            yield
    finally:
        display.close()


def progress_display(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """For a library call with a `progress` flag: the active sink if there is one, else (when enabled)
    rich bars on stderr for the duration."""
    return show_progress() if enabled and not progress_active() else contextlib.nullcontext()
