"""The scoring service: the harness's end of the `score` command (`_score_client.py`).

The agent never scores itself: its `score` command sends one JSON line over a Unix socket that the
sandbox sees as /run/openrebench/score.sock, and the harness scores (in a fresh sandbox) and answers.
The socket is reachable by whatever runs in the agent's sandbox, so every connection gets exactly one
one-line JSON answer, whatever it sent (garbage, an oversized or unfinished request) and whatever
scoring did; a failure of the harness is reported as such, without its details.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from openrebench.runs import Run

from . import _score_client

MAX_REQUEST = 4096  # bytes of one request line on the scoring socket
REQUEST_TIMEOUT_S = 30.0
# Connections of one run served at once (`score` asks one at a time; a queue of scorings fits): more wait
# in the kernel's listen queue, unaccepted, holding no descriptor of the harness's, which every run and
# the model gateway share (a flood of one run's socket must not leave another run none to score with).
MAX_CONNECTIONS = 16
BACKLOG = 64
SCORE_FAILED = ("Invalid: infrastructure failure (the harness failed while scoring), not caused "
                "by your solution; the details are in the harness's log.")
LOG_FAILED = "the score log cannot be read right now (infrastructure failure)"

logger = logging.getLogger(__name__)


def format_log(run: Run) -> str:
    """The run's scorings so far, one line each (`score log`, the score_log tool); a hidden score shows
    only as valid."""
    env = run.env
    rows, _ = run.rows()
    out = []
    for r in rows:
        score = "invalid" if r.raw is None else (f"{r.raw:.4f}" if env.score_visible else "valid")
        out.append(f"#{r.index} {r.elapsed_s / 60:6.1f} min  {score:>10}  {r.message.splitlines()[0][:100]}")
    return "\n".join(out) or "no scores yet"


def install_client(bin_dir: Path) -> Path:
    """The `score` command for the sandbox's PATH (standard library only: it runs with the sandbox's
    Python and sees none of the package)."""
    client = bin_dir / "score"
    client.write_text(f"#!/usr/bin/env python3\n{Path(_score_client.__file__).read_text()}")
    client.chmod(0o755)
    return client


class ScoringService:
    """A Unix socket server answering `{"op": "score"}` and `{"op": "log"}` with `{"text": ...}`.

    `score` scores now and says what came of it; `log` is the score log as text. Both are called per
    request, so a caller may change what they do while the service runs.
    """

    def __init__(self, score: Callable[[], Awaitable[str]], log: Callable[[], str]) -> None:
        self._score = score
        self._log = log
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._serving: set[asyncio.Task[None]] = set()
        self.connections = 0  # served now, at most MAX_CONNECTIONS

    async def start(self, sock: Path) -> None:
        """Listen on `sock`, which every uid may use (the agent's may differ from the harness's)."""
        raise_fd_limit()
        if sock.is_socket():
            sock.unlink()  # a stale socket of an earlier harness
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.setblocking(False)
        listener.bind(str(sock))
        listener.listen(BACKLOG)
        sock.chmod(0o777)
        self._listener = listener
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listener, MAX_CONNECTIONS))

    def close(self) -> None:
        for task in [self._accepting, *self._serving]:
            if task is not None:
                task.cancel()
        if self._listener is not None:
            self._listener.close()

    async def _accept(self, listener: socket.socket, limit: int) -> None:
        """Accept a connection only while fewer than `limit` are served (a slot frees when one is answered
        or times out)."""
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(limit)
        while True:
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as e:  # EMFILE and the like: the harness's trouble, tried again shortly
                slots.release()
                logger.warning("the scoring socket could not accept a connection: %s", e)
                await asyncio.sleep(0.5)
                continue
            task = loop.create_task(self._serve(conn, slots))
            self._serving.add(task)  # held: the loop keeps only weak references to tasks
            task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: socket.socket, slots: asyncio.Semaphore) -> None:
        self.connections += 1
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=MAX_REQUEST)
        except OSError:
            conn.close()
        else:
            await self._handle(reader, writer)
        finally:
            self.connections -= 1
            slots.release()

    async def _answer(self, reader: asyncio.StreamReader) -> str:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
            request = json.loads(line or b"{}")
        except TimeoutError:
            return f"malformed request (no complete line within {REQUEST_TIMEOUT_S:g} s)"
        except (ValueError, UnicodeDecodeError, RecursionError):  # LimitOverrunError is a ValueError
            return f"malformed request (one JSON line of at most {MAX_REQUEST} bytes expected)"
        op = request.get("op") if isinstance(request, dict) else None
        if op == "score":
            try:
                return await self._score()
            except Exception:
                logger.exception("scoring over the socket failed")
                return SCORE_FAILED
        if op == "log":
            try:
                return self._log()
            except Exception:
                logger.exception("reading the score log failed")
                return LOG_FAILED
        return "unknown request (expected op 'score' or 'log')"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            text = await self._answer(reader)
            writer.write(json.dumps({"text": text}).encode())
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer to
        except TimeoutError:
            writer.transport.abort()  # it does not read its answer: it holds the slot no longer
        finally:
            writer.close()


def raise_fd_limit() -> None:
    """Raise this process's soft limit of open descriptors to its hard limit: every run's scoring socket
    (MAX_CONNECTIONS each), the model gateway's sockets (their own caps per grant), scorings and sandboxes
    share it, and the usual soft limit of 1024 leaves no headroom for a few runs at their caps."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the kernel's usual nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
