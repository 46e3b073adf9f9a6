"""The gateway server: the OpenAI HTTP API on a Unix socket (and 127.0.0.1, if asked), metered per run.

Its clients may be hostile (the agent's code, a solution being scored), so every request gets one
OpenAI-shaped JSON answer whatever it sent, and a run reaches only the models it was granted, within
its budget. Status codes are those OpenAI uses, so standard clients raise their usual exceptions:
401 bad token, 404 model not granted, 400 bad request, 413 body too large, 429 budget spent (with
`x-should-retry: false`, so the openai client does not retry it), 503 backend unreachable, 504 timeout.

This module routes and answers; the grants are `_grants`'s, the usage rows `_metering`'s, the calls to
the backends `_upstream`'s and the writing of streamed answers `_stream_out`'s (mixins of `Gateway`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from openrebench.base import OpenRebenchError

from ._backends import ModelBackend
from ._fair import FairQueue
from ._grants import MAX_PENDING, Budget, Grant, RoleModel
from ._limits import (  # noqa: F401 - MAX_CHOICES and CAP_UNASKED: the gateway's limits, named here too
    CAP_UNASKED,
    MAX_CHOICES,
    Refusal,
    json_bytes,
    not_granted_args,
    prompt_bound,
    too_large,
)
from ._metering import Call, Metering, reported_usage
from ._prices import find_price
from ._responses import STATELESS, ResponsesRelay, from_chat, to_chat
from ._sites import GatewayThread, GrantSite
from ._stream_out import StreamAnswers
from ._streaming import ChatRelay, Relay
from ._upstream import BackendCalls, refused_as_400
from ._usage import UsageLog

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request: a long chat fits many times over
REQUEST_TIMEOUT_S = 600.0  # one model call, waiting for a free slot included
CONCURRENCY = 16  # model calls of one run at once
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses"}
KEEPALIVE_S = 15.0  # a connection idle this long (a new one that sent nothing too) is closed: each is a
# file descriptor of the harness's process, which serves every run


def error_response(status: int, message: str, type: str, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """An error as OpenAI words it: `{"error": {"message", "type", "param", "code"}}`."""
    return web.json_response({"error": {"message": message, "type": type, "param": None, "code": code}},
                             status=status, headers=headers)


@web.middleware
async def _openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, wrong method) and any bug, as OpenAI-shaped JSON."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, e.reason, "invalid_request_error")
    except Exception:
        logger.exception("the gateway failed on %s %s", request.method, request.path)
        return error_response(500, "internal error of the gateway", "server_error")


def _digest(token: str) -> str:
    # Grants are found by a hash of the token: a dict lookup then reveals nothing of the token's bytes.
    return hashlib.sha256(token.encode()).hexdigest()


class Gateway(StreamAnswers, BackendCalls, Metering):
    """The OpenAI-compatible gateway: `async with Gateway(sock, tcp_port=0) as gw:`, then `gw.grant(...)`.

    `prices` (from `load_prices`) override the price table for the models named in them. Requests that
    no grant owns (a bad token) are logged to `log_path` when given, else to Python's logging.
    """

    def __init__(self, socket_path: Path | None, tcp_port: int | None = None, *,
                 prices: Mapping[str, Mapping[str, float]] | None = None, max_body: int = MAX_BODY,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, concurrency: int = CONCURRENCY,
                 log_path: Path | None = None, shutdown_timeout_s: float = 60.0,
                 keepalive_timeout_s: float = KEEPALIVE_S, max_pending: int = MAX_PENDING) -> None:
        if socket_path is None and tcp_port is None:
            raise ValueError("the gateway needs a Unix socket, a TCP port or both")
        self.socket_path = None if socket_path is None else Path(socket_path)
        self._tcp_port = tcp_port
        self.prices = prices
        self.max_body, self.request_timeout_s, self.concurrency = max_body, request_timeout_s, concurrency
        self._grants: dict[str, Grant] = {}
        self._logs: dict[Path, UsageLog] = {}
        self._backends: dict[int, ModelBackend] = {}
        self._queues: dict[int, FairQueue] = {}  # by backend: its fair share among grants
        self._sites: dict[str, GrantSite] = {}  # by token digest: the grants' own sockets
        self._by_socket: dict[str, Grant] = {}  # a grant by its own socket's path
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lock = threading.Lock()  # grants are made and revoked from other threads
        self._anonymous = None if log_path is None else UsageLog(log_path)
        self._runner: web.AppRunner | None = None
        self.shutdown_timeout_s = shutdown_timeout_s  # requests in flight at `close` then end, charged
        self.keepalive_timeout_s = keepalive_timeout_s
        self.max_pending = max_pending

    # -- grants ---------------------------------------------------------------------------------------

    def grant(self, token: str | None = None, *, roles: Mapping[str, RoleModel], usage_path: Path,
              budget: Budget | None = None, run_id: str | None = None,
              concurrency: int | None = None, phase: str | None = None,
              socket_path: Path | None = None) -> Grant:
        """Let the holder of `token` (a new random one if None) use `roles` within `budget`, logging to
        `usage_path`. The budget counts the rows of `run_id` in that file, so a run granted again with
        the same id (after a restart, or with a new token) keeps counting what it spent, while grants of
        other ids writing to the same file (a run's agent, each of its scorings) spend apart.

        `socket_path`: a Unix socket of the grant's own, bound before this returns and served once the
        gateway runs. It answers this token only, and holds at most `max_pending` connections at once
        (more are answered 429 and closed as they come): connections on the shared socket cannot be
        told apart before they send a request, so a sandbox is shown its grant's socket alone."""
        if not roles:
            raise OpenRebenchError("a grant needs at least one role")
        budget = budget or Budget()
        prices = {r: m.price if m.price is not None else find_price(m.model_name, self.prices)[0]
                  for r, m in roles.items()}
        unpriced = sorted(m.model_name for r, m in roles.items() if prices[r] is None)
        if budget.usd is not None and unpriced:
            raise OpenRebenchError(f"a dollar budget needs a price for {', '.join(unpriced)}: give it in "
                                   "the prices (or RoleModel.price), or budget tokens instead")
        token = token or secrets.token_urlsafe(32)
        path = Path(usage_path).resolve()
        with self._lock:
            log = self._logs.get(path)
            if log is None:
                log = self._logs[path] = UsageLog(path)
            grant = Grant(token, run_id or path.parent.name, dict(roles), budget, log, prices,
                          concurrency or self.concurrency, phase, self.max_pending,
                          None if socket_path is None else Path(socket_path), self.max_pending)
            if grant.socket_path is not None:
                self._own_socket(grant)
            self._grants[_digest(token)] = grant
            self._backends.update((id(m.backend), m.backend) for m in roles.values())
        return grant

    def revoke(self, token: str) -> None:
        """The token no longer opens anything (requests in flight finish and are logged); its own
        socket, if it has one, is closed and removed."""
        with self._lock:
            grant = self._grants.pop(_digest(token), None)
            site = self._sites.pop(_digest(token), None)
        if site is not None:
            self._on_loop(site.stop())
        if grant is not None and grant.socket_path is not None:
            grant.socket_path.unlink(missing_ok=True)

    def forget(self, backend: ModelBackend) -> None:
        """No grant will use `backend` again (its server is going away): drop it and close its client."""
        with self._lock:
            self._backends.pop(id(backend), None)
            self._queues.pop(id(backend), None)
        aclose = getattr(backend, "aclose", None)
        if aclose is not None:
            self._on_loop(aclose())

    # -- a grant's own socket -------------------------------------------------------------------------

    def _own_socket(self, grant: Grant) -> None:
        """Bind and listen now (a client may connect at once: it waits in the backlog), serve from the
        gateway's loop: now if it runs, else when it starts."""
        assert grant.socket_path is not None
        grant.socket_path.parent.mkdir(parents=True, exist_ok=True)
        grant.socket_path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(grant.socket_path))
            grant.socket_path.chmod(0o777)  # the sandbox's uid may differ from the harness's
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._by_socket[str(grant.socket_path)] = grant
        site = GrantSite(self, grant, sock)
        self._sites[_digest(grant.token)] = site
        if self._runner is not None:
            self._on_loop(site.open(self._runner))

    def _on_loop(self, coro: Any) -> None:
        """Run `coro` on the gateway's loop, from whichever thread this is called, in a context of its
        own: a server started from a caller's context would serve every connection in it (Inspect's
        sample context, say, which would then count the gateway's model calls as the agent's)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = loop.create_task(coro, context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, loop)

    def _grant_of(self, request: web.Request) -> Grant | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        grant = self._grants.get(_digest(token.strip()))
        transport = request.transport
        own = self._by_socket.get(str(transport.get_extra_info("sockname") or "")) if transport else None
        if own is not None and own is not grant:
            return None  # a grant's socket answers its own token only
        return grant

    # -- serving --------------------------------------------------------------------------------------

    @property
    def tcp_port(self) -> int | None:
        """The TCP port served on 127.0.0.1 (the one picked, when 0 was asked), or None."""
        if self._runner is None or self._tcp_port is None:
            return self._tcp_port
        for address in self._runner.addresses:
            if isinstance(address, tuple):
                return int(address[1])
        return self._tcp_port

    @property
    def base_url(self) -> str | None:
        """`http://127.0.0.1:PORT/v1` for clients outside the sandbox, when a TCP port is served."""
        return None if self.tcp_port is None else f"http://127.0.0.1:{self.tcp_port}/v1"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body, middlewares=[_openai_errors])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        for path in ENDPOINTS:
            app.router.add_post(path, self._serve)
        app.router.add_route("*", "/v1/responses/{rest:.+}", self._stored)
        return app

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=self.shutdown_timeout_s,
                                     keepalive_timeout=self.keepalive_timeout_s)
        await self._runner.setup()
        try:
            for site in list(self._sites.values()):  # grants made before the gateway started
                await site.open(self._runner)
            if self.socket_path is not None:
                self.socket_path.parent.mkdir(parents=True, exist_ok=True)
                self.socket_path.unlink(missing_ok=True)
                await web.UnixSite(self._runner, str(self.socket_path)).start()
                self.socket_path.chmod(0o777)  # the sandbox's uid may differ from the harness's
            if self._tcp_port is not None:
                await web.TCPSite(self._runner, "127.0.0.1", self._tcp_port).start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # the grants' sites with the rest
            self._runner = None
            if self.socket_path is not None:
                self.socket_path.unlink(missing_ok=True)
        for site in list(self._sites.values()):
            site.close_socket()
            if site.path is not None:
                site.path.unlink(missing_ok=True)
        for backend in list(self._backends.values()):  # their HTTP clients, bound to this loop
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                await aclose()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_in_thread(self) -> GatewayThread:
        """Serve from a thread of its own, with its own event loop (for callers without one)."""
        return GatewayThread(self).start()

    # -- handlers -------------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _authorised(self, request: web.Request) -> Grant:
        grant = self._grant_of(request)
        if grant is None:
            raise Refusal(401, "invalid or missing API key (expected 'Authorization: Bearer <token>')",
                           "invalid_request_error", "invalid_api_key")
        return grant

    @staticmethod
    def _model_entry(role: str, model: RoleModel) -> dict[str, Any]:
        return {"id": role, "object": "model", "created": 0, "owned_by": "openrebench",
                "model": model.model_name}

    async def _models(self, request: web.Request) -> web.Response:
        try:
            grant = self._authorised(request)
        except Refusal as r:
            return error_response(r.status, r.message, r.type, r.code)
        return web.json_response({"object": "list", "data": [self._model_entry(r, m)
                                                             for r, m in grant.roles.items()]})

    async def _model(self, request: web.Request) -> web.Response:
        try:
            grant = self._authorised(request)
        except Refusal as r:
            return error_response(r.status, r.message, r.type, r.code)
        found = grant.resolve(request.match_info["model"])
        if found is None:
            return _not_granted(request.match_info["model"])
        return web.json_response(self._model_entry(*found))

    async def _stored(self, request: web.Request) -> web.Response:
        """A stored response asked for (retrieved, cancelled, its input items): the gateway keeps none."""
        try:
            self._authorised(request)
        except Refusal as r:
            return error_response(r.status, r.message, r.type, r.code)
        return error_response(404, f"{request.method} {request.path[:100]}: {STATELESS}",
                              "invalid_request_error", "not_stored")

    async def _body(self, request: web.Request) -> tuple[dict[str, Any], int]:
        if request.content_length is not None and request.content_length > self.max_body:
            raise too_large(self.max_body)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large(self.max_body) from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Refusal(400, "the request body is not valid JSON", "invalid_request_error",
                           "invalid_json") from None
        if not isinstance(body, dict):
            raise Refusal(400, "the request body must be a JSON object", "invalid_request_error",
                           "invalid_json")
        return body, len(raw)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        """One model call: authorise, wait for one of the run's slots, read, resolve the model, hold
        its worst case against the budget, call, meter, answer (whole, or streamed as it comes).

        The body is read only once a slot is held, so a run's requests hold at most `concurrency`
        bodies in the harness's memory however many connections it opens. A call that times out or is
        cancelled (the gateway closing) is charged what it held: the provider may have spent it. The
        hold is released only after the row is counted, so the budget never sees the call as neither."""
        t0 = time.perf_counter()
        endpoint = ENDPOINTS[request.path]
        call = Call()
        try:
            return await self._metered(request, endpoint, call, t0)
        finally:
            call.release()

    async def _metered(self, request: web.Request, endpoint: str, call: Call, t0: float
                       ) -> web.StreamResponse:
        try:
            call.grant = self._authorised(request)
            if request.content_length is not None and request.content_length > self.max_body:
                raise too_large(self.max_body)
            if call.grant.pending >= call.grant.max_pending:
                raise Refusal(429, f"too many requests of this run at once (at most "
                              f"{call.grant.max_pending} in flight or waiting)", "rate_limit_exceeded",
                              "too_many_requests")
            call.grant.pending += 1
            try:
                async with asyncio.timeout(self.request_timeout_s) as timer, call.grant.slots:
                    return await self._answer(request, endpoint, call, t0, timer)
            except TimeoutError:
                if call.response is not None:  # a stream under way: it ended itself, with an error event
                    return call.response
                raise Refusal(504, f"the model call took longer than {self.request_timeout_s:g} s",
                              "timeout", "timeout") from None
            finally:
                call.grant.pending -= 1
        except Refusal as r:
            self._record(call.grant, call.role, call.model, endpoint, t0, status=r.status, error=r.message,
                         **call.charge())
            return error_response(r.status, r.message, r.type, r.code, r.headers)
        except asyncio.CancelledError:
            if not call.recorded:
                self._record(call.grant, call.role, call.model, endpoint, t0, status=499, **call.charge(),
                             error="cancelled (the gateway closed): charged what the call held")
            raise

    async def _answer(self, request: web.Request, endpoint: str, call: Call, t0: float,
                      timer: asyncio.Timeout) -> web.StreamResponse:
        grant = call.grant
        assert grant is not None
        body, _ = await self._body(request)
        found = grant.resolve(body.get("model"))
        if found is None:
            raise Refusal(*not_granted_args(body.get("model")))
        call.role, call.model = found
        backend, name = call.model.backend, call.model.model_name
        responses = None
        kind = "completions" if endpoint == "completions" else "chat"  # what the backend is asked
        with refused_as_400():
            if endpoint == "responses":
                body, responses = to_chat(body)
            stream = bool(body.pop("stream", False))
            options = body.pop("stream_options", None)
            check = getattr(backend, "check", None)
            if check is not None:  # what the backend would not honour in full: refused, never dropped
                check(kind, body)
        spent = grant.exhausted()
        if spent is not None:
            raise Refusal(429, spent, "budget_exceeded", "budget_exceeded", {"x-should-retry": "false"})
        call.reserve(grant, prompt_bound(kind, body), body)  # or refused: no backend call
        if stream:
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            relay: Relay = (ChatRelay(name, kind, include_usage) if responses is None
                            else ResponsesRelay(responses, name))
            return await self._stream(request, endpoint, kind, call, body, relay, t0, timer)
        output = await self._whole(call, kind, body)
        choices = output.get("choices")
        prompt, completion = self._settle(call, endpoint, t0, reported_usage(output, backend),
                                          json_bytes(choices))
        if responses is not None:
            return web.json_response(from_chat(output, responses, name, prompt, completion))
        output["model"] = name
        return web.json_response(output)


def _not_granted(name: object) -> web.Response:
    return error_response(*not_granted_args(name))
