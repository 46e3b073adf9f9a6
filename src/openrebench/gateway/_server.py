"""The gateway server: the OpenAI HTTP API on a Unix socket (and 127.0.0.1, if asked), metered per run.

Its clients may be hostile (the agent's code, a solution being scored), so every request gets one
OpenAI-shaped JSON answer whatever it sent, and a run reaches only the models it was granted, within
its budget. Status codes are those OpenAI uses, so standard clients raise their usual exceptions:
401 bad token, 404 model not granted, 400 bad request, 413 body too large, 429 budget spent (with
`x-should-retry: false`, so the openai client does not retry it), 503 backend unreachable, 504 timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import secrets
import socket
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from openrebench.base import OpenRebenchError

from ._backends import Backend, BackendError
from ._fair import DEFAULT_CAPACITY, FairQueue
from ._limits import (  # noqa: F401 - MAX_CHOICES and CAP_UNASKED: the gateway's limits, named here too
    CAP_UNASKED,
    MAX_CHOICES,
    Refusal,
    json_bytes,
    limit,
    not_granted_args,
    prompt_bound,
    too_large,
)
from ._prices import find_price
from ._responses import STATELESS, ResponsesRelay, from_chat, to_chat
from ._sites import GatewayThread, GrantSite
from ._streaming import ChatRelay, Relay, StreamMeter, whole_as_chunks
from ._usage import Totals, UsageLog, cost_usd

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request: a long chat fits many times over
REQUEST_TIMEOUT_S = 600.0  # one model call, waiting for a free slot included
CONCURRENCY = 16  # model calls of one run at once
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses"}
MAX_PENDING = 128  # requests of one grant in flight or waiting for a slot: more are refused at once (each
# holds a connection, hence a file descriptor of the harness, until it ends)
STREAM_WRITE_TIMEOUT_S = 30.0  # a streaming client this long without taking in an event is dropped
KEEPALIVE_S = 15.0  # a connection idle this long (a new one that sent nothing too) is closed: each is a
# file descriptor of the harness's process, which serves every run


@dataclass(frozen=True)
class RoleModel:
    """The model behind a role: its backend, the name clients see (and the price is looked up by), and
    optionally its price in US$ per million input/output tokens (else the price table's)."""

    backend: Backend
    model_name: str
    price: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Budget:
    """What a run may spend: dollars, tokens (input plus output), either or both; None is no limit."""

    usd: float | None = None
    tokens: int | None = None


@dataclass
class Grant:
    """A run's access: its roles, budget and usage log, reached with its bearer token."""

    token: str = field(repr=False)
    run_id: str
    roles: dict[str, RoleModel]
    budget: Budget
    usage: UsageLog
    prices: dict[str, Mapping[str, float] | None]
    concurrency: int
    phase: str | None = None  # when the run uses it (`agent`, `scoring`), recorded in each row
    max_pending: int = MAX_PENDING
    socket_path: Path | None = None  # the grant's own socket, if it has one (see `Gateway.grant`)
    max_connections: int = MAX_PENDING
    slots: asyncio.Semaphore = field(init=False, repr=False)
    pending: int = field(init=False, default=0, repr=False)
    connections: int = field(init=False, default=0, repr=False)

    @property
    def socket_dir(self) -> Path | None:
        """The folder of the grant's own socket: what a sandbox binds (a folder, so that the socket of a
        restarted gateway shows through the bind)."""
        return None if self.socket_path is None else self.socket_path.parent

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.concurrency)

    def totals(self) -> Totals:
        """What this grant's budget has spent: the rows of its id (a grant again for the same id, after
        a restart, goes on counting them)."""
        return self.usage.totals(self.run_id)

    def room(self, price: Mapping[str, float] | None, prompt: int, spent: Totals, held: tuple[int, float]
             ) -> tuple[int | None, str]:
        """Completion tokens the budget has room for once `prompt` tokens are taken off, after what is
        `spent` and what the requests in flight hold (None: no limit; negative: the prompt alone does not
        fit), and the budget that binds, in words."""
        room: int | None = None
        what = "token budget"
        if self.budget.tokens is not None:
            room = self.budget.tokens - spent.tokens - held[0] - prompt
        if self.budget.usd is not None and price:
            # A hair under what is left, so that summing the rows' float costs stays within the budget.
            left = (self.budget.usd - spent.cost_usd - held[1]) * (1 - 1e-9) - cost_usd(price, prompt, 0)
            out = price.get("output", 0.0)
            dollars = math.floor(left / out * 1e6) if out > 0 else None if left >= 0 else -1
            if dollars is not None and (room is None or dollars < room):
                room, what = dollars, "dollar budget"
        return room, what

    def reserve(self, role: str, prompt: int, body: dict[str, Any]) -> tuple[int, float, bool]:
        """Hold the request's worst case against the budget, atomically with the check: `prompt` (a bound,
        see `prompt_bound`) plus its completion cap times its choices, the cap shrunk (and imposed) to what
        remains; refused (429) when even one token a choice does not fit. Gives the completion tokens
        and the dollars held, and whether a budget capped the request."""
        price, model = self.prices[role], self.roles[role]
        who = "this scoring" if self.phase == "scoring" else "the run"
        most = getattr(model.backend, "max_choices", None)

        def decide(spent: Totals, held_tokens: int, held_usd: float
                   ) -> tuple[int, float, tuple[int, float, bool]]:
            room, what = self.room(price, prompt, spent, (held_tokens, held_usd))
            completion = limit(body, room, prompt, f"{who}'s {what}", max_choices=most,
                               model=model.model_name)
            usd = cost_usd(price, prompt, completion)
            return prompt + completion, usd, (completion, usd, room is not None)

        return self.usage.reserve(self.run_id, decide)

    def resolve(self, name: object) -> tuple[str, RoleModel] | None:
        """The role a request's `model` names: the role itself or its model's name."""
        if not isinstance(name, str):
            return None
        if name in self.roles:
            return name, self.roles[name]
        return next(((r, m) for r, m in self.roles.items() if m.model_name == name), None)

    def exhausted(self) -> str | None:
        """Which budget is spent, in words, or None."""
        t = self.totals()
        who = "this scoring" if self.phase == "scoring" else "the run"
        if self.budget.usd is not None and t.cost_usd >= self.budget.usd:
            return (f"budget exceeded: {who} has spent ${t.cost_usd:.4f} of its ${self.budget.usd:.4f} "
                    "dollar budget")
        if self.budget.tokens is not None and t.tokens >= self.budget.tokens:
            return (f"budget exceeded: {who} has used {t.tokens:,} of its {self.budget.tokens:,} "
                    "token budget")
        return None


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


class Gateway:
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
        self._backends: dict[int, Backend] = {}
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

    def forget(self, backend: Backend) -> None:
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
        call = _Call()
        try:
            return await self._metered(request, endpoint, call, t0)
        finally:
            call.release()

    async def _metered(self, request: web.Request, endpoint: str, call: _Call, t0: float
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

    async def _answer(self, request: web.Request, endpoint: str, call: _Call, t0: float,
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
        with _refused_as_400():
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
        prompt, completion = self._settle(call, endpoint, t0, _reported(output, backend),
                                          json_bytes(choices))
        if responses is not None:
            return web.json_response(from_chat(output, responses, name, prompt, completion))
        output["model"] = name
        return web.json_response(output)

    async def _whole(self, call: _Call, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """The backend's whole answer, its failures as the client's errors."""
        assert call.grant is not None and call.model is not None
        backend = call.model.backend
        async with self._queue(backend).slot(call.grant.run_id):
            ask = backend.chat if kind == "chat" else backend.complete
            output = await self._from_backend(call, ask(body))
        call.started = False
        if not isinstance(output, dict):
            raise Refusal(502, f"the backend of {call.model.model_name} gave no response object",
                          "upstream_error", "upstream_error")
        return output

    async def _from_backend(self, call: _Call, answer: Awaitable[Any]) -> Any:
        """The backend's answer (or first chunk), its failures as the client's errors."""
        try:
            return await answer
        except BackendError as e:
            call.started = e.status == 504  # refused upstream, nothing spent, unless it timed out
            raise Refusal(e.status, e.message, e.type, e.type) from None
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as e:
            call.started = False
            raise self._broken(call, e) from None

    @staticmethod
    def _broken(call: _Call, e: Exception, when: str = "") -> Refusal:
        """A backend's own bug, logged here and told without its details (they may be the harness's)."""
        name = call.model.model_name if call.model is not None else "?"
        logger.error("the backend of %s failed%s", name, when, exc_info=e)
        return Refusal(502, f"the backend of {name} failed{when} ({type(e).__name__})", "upstream_error",
                       "upstream_error")

    async def _stream(self, request: web.Request, endpoint: str, kind: str, call: _Call,
                      body: dict[str, Any], relay: Relay, t0: float, timer: asyncio.Timeout
                      ) -> web.StreamResponse:
        """A streamed answer: the backend's chunks passed on as they come (its whole answer at once, where
        it does not stream), metered when the stream ends. Until the first chunk a failure is an HTTP
        error as for a whole answer; after it, an event of the stream, and the row is written here."""
        assert call.grant is not None and call.model is not None
        backend = call.model.backend
        meter = StreamMeter(bool(getattr(backend, "usage_counts_one_choice", False)))
        async with self._queue(backend).slot(call.grant.run_id):
            chunks = _chunks(backend, kind, body)
            try:
                first = await self._from_backend(call, anext(chunks, None))
                return await self._relay(request, endpoint, call, chunks, first, relay, meter, t0, timer)
            finally:
                await chunks.aclose()  # a stream left early: its upstream connection is dropped

    async def _relay(self, request: web.Request, endpoint: str, call: _Call,
                     chunks: AsyncGenerator[dict[str, Any], None], first: dict[str, Any] | None, relay: Relay,
                     meter: StreamMeter, t0: float, timer: asyncio.Timeout) -> web.StreamResponse:
        """Write the stream; settle its row however it ends. A client that leaves mid-stream, or a backend
        that fails in it, is charged the prompt and what was streamed (its bytes bound its tokens; the
        upstream is closed at once, so little more is written); a timeout or the gateway closing, what
        the call held, as for a whole answer."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        failure: Refusal | None = None
        try:
            await _prepare(response, request)
            call.response = response
            await _write(response, relay.start())
            chunk = first
            while chunk is not None:
                meter.add(chunk)
                await _write(response, relay.chunk(chunk))
                chunk = await anext(chunks, None)
        except _ClientGone:
            await chunks.aclose()
            self._settle_partial(call, endpoint, t0, meter, 499, "the client left mid-stream: charged the "
                                 "prompt and what was streamed (its bytes bound its tokens)")
            call.response = response
            return response
        except BackendError as e:
            failure = Refusal(e.status, e.message, e.type, e.type)
        except asyncio.CancelledError:
            failure = (Refusal(504, f"the model call took longer than {self.request_timeout_s:g} s",
                               "timeout", "timeout") if timer.expired() else
                       Refusal(499, "cancelled (the gateway closed): charged what the call held",
                               "server_error", "cancelled"))
            prompt, completion = call.prompt_bound, call.completion_held if call.capped else meter.streamed
            self._record(call.grant, call.role, call.model, endpoint, t0, status=failure.status,
                         prompt=prompt, completion=completion, error=failure.message)
            call.recorded = True
            with contextlib.suppress(_ClientGone):  # a last word, if the client takes it at once
                await _write(response, relay.fail(failure.message, failure.type, failure.code), timeout_s=1.0)
            raise
        except Exception as e:
            failure = self._broken(call, e, " mid-stream")
        else:
            prompt, completion = self._settle(call, endpoint, t0, meter.reported(), meter.streamed)
            try:
                await _write(response, relay.finish(prompt, completion, meter.upstream_usage()), eof=True)
            except _ClientGone:
                pass
            except Exception:  # its row is written: a bug here must not answer a second time
                logger.exception("the gateway failed to end a stream of %s", call.model.model_name)
            return response
        self._settle_partial(call, endpoint, t0, meter, failure.status, failure.message)
        with contextlib.suppress(_ClientGone):
            await _write(response, relay.fail(failure.message, failure.type, failure.code), eof=True,
                         timeout_s=1.0)
        return response

    def _settle(self, call: _Call, endpoint: str, t0: float, reported: tuple[int | None, int | None],
                bound: int) -> tuple[int, int]:
        """Charge an answered call what its backend reported (never nothing: the gateway's bounds, the
        prompt's and `bound` for the completion, where it reported no usage), record its row, and give
        the tokens charged."""
        model = call.model
        assert model is not None
        prompt, completion = reported
        error = None
        if prompt is None or completion is None:  # never free: the bounds, from the bytes
            error = "the backend reported no usage: charged the gateway's bound"
            if prompt is None:
                prompt = call.prompt_bound
            if completion is None:
                completion = min(bound, call.completion_held) if call.capped else bound
        over = max(prompt - call.prompt_bound, 0) + max(completion - call.completion_held, 0)
        if call.capped and over > 0:  # a backend past its max_tokens, or a prompt past the bound: counted
            error = f"the backend reported {over:,} token(s) more than the gateway reserved"
            logger.warning("%s: %s (prompt %d of %d, completion %d of %d)", model.model_name, error, prompt,
                           call.prompt_bound, completion, call.completion_held)
        self._record(call.grant, call.role, model, endpoint, t0, status=200, prompt=prompt,
                     completion=completion, error=error)
        call.recorded = True
        return prompt, completion

    def _settle_partial(self, call: _Call, endpoint: str, t0: float, meter: StreamMeter, status: int,
                        error: str) -> None:
        """Charge a stream that ended early: the prompt (as reported, else its bound) and what was
        streamed (its bytes, within what the call held)."""
        prompt = meter.reported()[0]
        completion = min(meter.streamed, call.completion_held) if call.capped else meter.streamed
        self._record(call.grant, call.role, call.model, endpoint, t0, status=status, error=error,
                     prompt=call.prompt_bound if prompt is None else prompt, completion=completion)
        call.recorded = True

    def _queue(self, backend: Backend) -> FairQueue:
        """The backend's fair queue, shared by every grant that uses it (`capacity`: its own, if it
        names one, e.g. the llama.cpp server's slots)."""
        queue = self._queues.get(id(backend))
        if queue is None:
            capacity = getattr(backend, "capacity", None) or DEFAULT_CAPACITY
            queue = self._queues[id(backend)] = FairQueue(int(capacity))
        return queue

    def _record(self, grant: Grant | None, role: str | None, model: RoleModel | None, endpoint: str,
                t0: float, *, status: int, prompt: int | None = 0, completion: int | None = 0,
                error: str | None = None) -> None:
        log = grant.usage if grant is not None else self._anonymous
        fields = {"grant": None if grant is None else grant.run_id,
                  "phase": None if grant is None else grant.phase, "role": role,
                  "model": None if model is None else model.model_name, "endpoint": endpoint,
                  "status": status, "prompt_tokens": prompt or 0, "completion_tokens": completion or 0,
                  "price": None if grant is None or role is None else grant.prices[role],
                  "latency_s": time.perf_counter() - t0, "error": error}
        if log is None:
            logger.info("gateway request without a grant: %s", fields)
            return
        try:
            log.record(**fields)
        except FileNotFoundError:  # a request that outlived its run (a throw-away calibration run, removed)
            logger.warning("the usage log %s is gone (its run was removed): a request not logged", log.path)
        except OSError:
            logger.exception("the usage log %s cannot be written", log.path)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class _Call:
    """One request on its way: whom it is for, and what of the budget it holds while in flight."""

    grant: Grant | None = None
    role: str | None = None
    model: RoleModel | None = None
    prompt_bound: int = 0
    completion_held: int = 0
    capped: bool = False  # a budget capped it: what it holds is all it may spend
    started: bool = False  # the backend has it: a timeout or cancellation may have cost the provider
    response: web.StreamResponse | None = None  # a stream's, once its headers are sent
    recorded: bool = False  # its row is written
    _held: tuple[int, float] | None = None

    def reserve(self, grant: Grant, prompt: int, body: dict[str, Any]) -> None:
        assert self.role is not None
        self.completion_held, usd, self.capped = grant.reserve(self.role, prompt, body)
        self.prompt_bound = prompt
        self._held = (prompt + self.completion_held, usd)
        self.started = True

    def release(self) -> None:
        if self._held is not None and self.grant is not None:
            self.grant.usage.hold(-self._held[0], -self._held[1], self.grant.run_id)
            self._held = None

    def charge(self) -> dict[str, int]:
        """What a call that ended without an answer is charged: nothing, unless the backend had it."""
        if not self.started:
            return {}
        return {"prompt": self.prompt_bound, "completion": self.completion_held}


def _not_granted(name: object) -> web.Response:
    return error_response(*not_granted_args(name))


@contextlib.contextmanager
def _refused_as_400() -> Iterator[None]:
    """A request the gateway or its backend will not serve as asked (a BackendError before any call):
    refused with its status, nothing held or spent."""
    try:
        yield
    except BackendError as e:
        raise Refusal(e.status, e.message, e.type, e.type) from None


def _reported(output: dict[str, Any], backend: Backend) -> tuple[int | None, int | None]:
    """The prompt and completion tokens a whole answer reports (None: not reported); a backend whose
    usage counts one choice (llama.cpp's) is charged its count once a choice."""
    usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    choices = output.get("choices")
    one_choice = getattr(backend, "usage_counts_one_choice", False)
    if completion is not None and one_choice and isinstance(choices, list):
        completion *= max(1, len(choices))
    return prompt, completion


async def _chunks(backend: Backend, kind: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
    """The chunks of an answer: the backend's own stream where it has one, else its whole answer as
    chunks, once it is written."""
    stream = getattr(backend, "stream", None)
    if stream is not None:
        async for chunk in stream(kind, body):
            yield chunk
        return
    output = await (backend.chat if kind == "chat" else backend.complete)(body)
    if not isinstance(output, dict):
        raise BackendError(f"the backend of {getattr(backend, 'name', 'the model')} gave no response object")
    for chunk in whole_as_chunks(output, kind):
        yield chunk


class _ClientGone(Exception):
    """The client closed its connection while its stream was being written."""


async def _prepare(response: web.StreamResponse, request: web.Request) -> None:
    try:
        await response.prepare(request)
    except ConnectionError:
        raise _ClientGone from None


async def _write(response: web.StreamResponse, data: bytes, eof: bool = False,
                 timeout_s: float | None = None) -> None:
    """Send `data` now (a stream's events are not held back), and end the body if `eof`. A client that
    takes more than `STREAM_WRITE_TIMEOUT_S` to take it in is gone: a stream holds one of the backend's
    places, which a client that stops reading must not keep from other runs for the whole time limit."""
    try:
        async with asyncio.timeout(timeout_s or STREAM_WRITE_TIMEOUT_S):
            if data:
                await response.write(data)
            if eof:
                await response.write_eof()
    except (ConnectionError, TimeoutError):
        raise _ClientGone from None
