"""Where the gateway listens: a grant's own socket, its connections capped, and the thread the gateway
serves from for callers without an event loop of their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

if TYPE_CHECKING:
    from ._grants import Grant
    from ._server import Gateway


class _TooMany(asyncio.Protocol):
    """A connection over a grant's limit: answered 429 and closed, before it can hold anything. The close
    waits for the request (at most a second), as closing on unread bytes would reset the connection and
    lose the answer."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = json.dumps({"error": {"message": f"too many connections of this run at once (at most "
                                                f"{self.limit})", "type": "rate_limit_exceeded",
                                     "param": None, "code": "too_many_connections"}}).encode()
        head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nx-should-retry: false\r\nConnection: close\r\n\r\n")
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        transport.write(head.encode() + body)
        asyncio.get_running_loop().call_later(1.0, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's handler of one connection, counted against its grant while the connection lives."""

    def __init__(self, inner: asyncio.Protocol, grant: Grant) -> None:
        self.inner, self.grant = inner, grant
        grant.connections += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.grant.connections -= 1
        self.inner.connection_lost(exc)


class GrantSite(web.BaseSite):
    """A grant's own socket, served by the gateway's app, its connections capped."""

    def __init__(self, gateway: Gateway, grant: Grant, sock: socket.socket) -> None:
        self._gateway, self._grant, self._sock = gateway, grant, sock
        self._opened = self._stopped = False

    @property
    def name(self) -> str:
        return f"http://unix:{self._grant.socket_path}:"

    @property
    def path(self) -> Path | None:
        return self._grant.socket_path

    async def open(self, runner: web.AppRunner) -> None:
        if self._opened:
            return
        self._opened = True
        super().__init__(runner, shutdown_timeout=self._gateway.shutdown_timeout_s)
        await self.start()

    async def start(self) -> None:
        await super().start()
        handler = self._runner.server
        assert handler is not None
        grant = self._grant

        def protocol() -> asyncio.Protocol:
            if grant.connections >= grant.max_connections:
                return _TooMany(grant.max_connections)
            return _Counted(handler(), grant)

        self._server = await asyncio.get_running_loop().create_unix_server(protocol, sock=self._sock)

    async def stop(self) -> None:
        if self._opened and not self._stopped:
            self._stopped = True
            with contextlib.suppress(RuntimeError):  # the runner's cleanup may have stopped it first
                await super().stop()
        self.close_socket()

    def close_socket(self) -> None:
        self._sock.close()


T = TypeVar("T")


class GatewayThread:
    """A gateway served from a daemon thread with its own event loop; `stop()` (or leaving the `with`)
    closes it. Grants may be made and revoked from any thread."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="openrebench-gateway", daemon=True)

    def start(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.gateway.start()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.gateway.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run `coro` on the gateway's loop (its backends are bound to it) from another thread, and wait."""
        if self._loop is None or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the gateway is not serving")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def alive(self) -> bool:
        """Whether the thread still serves (it ends when stopped, or when its loop failed)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def __enter__(self) -> Gateway:
        return self.gateway

    def __exit__(self, *exc: object) -> None:
        self.stop()
