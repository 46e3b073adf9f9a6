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
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from openrebench.base import OpenRebenchError

from ._backends import Backend, BackendError
from ._fair import DEFAULT_CAPACITY, FairQueue
from ._prices import find_price
from ._usage import Totals, UsageLog, cost_usd

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one request: a long chat fits many times over
REQUEST_TIMEOUT_S = 600.0  # one model call, waiting for a free slot included
CONCURRENCY = 16  # model calls of one run at once
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
MAX_CHOICES = 16  # `n` of one request: each choice is charged, and held against the budget meanwhile
CAP_UNASKED = 4096  # completion tokens per choice for a request that names no `max_tokens`, under a budget:
# imposed as its `max_tokens` and held (less where less remains; any model takes a cap this small)
MAX_PENDING = 128  # requests of one grant in flight or waiting for a slot: more are refused at once (each
# holds a connection, hence a file descriptor of the harness, until it ends)
KEEPALIVE_S = 15.0  # a connection idle this long (a new one that sent nothing too) is closed: each is a
# file descriptor of the harness's process, which serves every run
# The prompt's bound (`prompt_bound`). Byte-level BPE tokenizers (GPT-2, tiktoken, Llama 3) and
# SentencePiece with byte fallback (Gemma, the offline model) never make a token of less than one UTF-8
# byte, so the bytes of the text bound its tokens, whatever the text (multibyte characters, rare
# scripts, random bytes), and the bytes of a structure written as JSON (tools, tool calls) bound it
# rendered as JSON; the constants bound what a provider adds around them: chat-template tokens of one
# message (role header and separators: 3 to 5 in ChatML, Llama 3, Gemma, OpenAI's count), of one request
# (BOS, the assistant's header, Llama 3.1's default system header: about 30), and a tool-use preamble
# (Anthropic documents 264 to 346 tokens).
PROMPT_TOKENS_PER_MESSAGE = 8
PROMPT_TOKENS_PER_REQUEST = 64
PROMPT_TOKENS_FOR_TOOLS = 512


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
        price = self.prices[role]
        who = "this scoring" if self.phase == "scoring" else "the run"

        def decide(spent: Totals, held_tokens: int, held_usd: float
                   ) -> tuple[int, float, tuple[int, float, bool]]:
            room, what = self.room(price, prompt, spent, (held_tokens, held_usd))
            completion = _limit(body, room, prompt, f"{who}'s {what}")
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


class _Refusal(Exception):
    def __init__(self, status: int, message: str, type: str, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.headers = dict(headers or {})


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
        self._sites: dict[str, _GrantSite] = {}  # by token digest: the grants' own sockets
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
        site = _GrantSite(self, grant, sock)
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
            raise _Refusal(401, "invalid or missing API key (expected 'Authorization: Bearer <token>')",
                           "invalid_request_error", "invalid_api_key")
        return grant

    @staticmethod
    def _model_entry(role: str, model: RoleModel) -> dict[str, Any]:
        return {"id": role, "object": "model", "created": 0, "owned_by": "openrebench",
                "model": model.model_name}

    async def _models(self, request: web.Request) -> web.Response:
        try:
            grant = self._authorised(request)
        except _Refusal as r:
            return error_response(r.status, r.message, r.type, r.code)
        return web.json_response({"object": "list", "data": [self._model_entry(r, m)
                                                             for r, m in grant.roles.items()]})

    async def _model(self, request: web.Request) -> web.Response:
        try:
            grant = self._authorised(request)
        except _Refusal as r:
            return error_response(r.status, r.message, r.type, r.code)
        found = grant.resolve(request.match_info["model"])
        if found is None:
            return _not_granted(request.match_info["model"])
        return web.json_response(self._model_entry(*found))

    async def _body(self, request: web.Request) -> tuple[dict[str, Any], int]:
        if request.content_length is not None and request.content_length > self.max_body:
            raise _too_large(self.max_body)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _too_large(self.max_body) from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise _Refusal(400, "the request body is not valid JSON", "invalid_request_error",
                           "invalid_json") from None
        if not isinstance(body, dict):
            raise _Refusal(400, "the request body must be a JSON object", "invalid_request_error",
                           "invalid_json")
        return body, len(raw)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        """One model call: authorise, wait for one of the run's slots, read, resolve the model, hold
        its worst case against the budget, call, meter, answer.

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
                raise _too_large(self.max_body)
            if call.grant.pending >= call.grant.max_pending:
                raise _Refusal(429, f"too many requests of this run at once (at most "
                               f"{call.grant.max_pending} in flight or waiting)", "rate_limit_exceeded",
                               "too_many_requests")
            call.grant.pending += 1
            try:
                async with asyncio.timeout(self.request_timeout_s), call.grant.slots:
                    output, stream, include_usage = await self._answer(request, endpoint, call)
            except TimeoutError:
                raise _Refusal(504, f"the model call took longer than {self.request_timeout_s:g} s",
                               "timeout", "timeout") from None
            finally:
                call.grant.pending -= 1
        except _Refusal as r:
            self._record(call.grant, call.role, call.model, endpoint, t0, status=r.status, error=r.message,
                         **call.charge())
            return error_response(r.status, r.message, r.type, r.code, r.headers)
        except asyncio.CancelledError:
            self._record(call.grant, call.role, call.model, endpoint, t0, status=499,
                         error="cancelled (the gateway closed): charged what the call held", **call.charge())
            raise
        grant, role, model = call.grant, call.role, call.model
        assert grant is not None and role is not None and model is not None
        usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        choices = output.get("choices")
        error = None
        if prompt is None or completion is None:  # never free: the bounds, from the bytes
            error = "the backend reported no usage: charged the gateway's bound"
            if prompt is None:
                prompt = call.prompt_bound
            if completion is None:
                completion = _json_bytes(choices)
                if call.capped:  # it was asked for no more than it held
                    completion = min(completion, call.completion_held)
        elif getattr(model.backend, "usage_counts_one_choice", False) and isinstance(choices, list):
            completion *= max(1, len(choices))
        over = max(prompt - call.prompt_bound, 0) + max(completion - call.completion_held, 0)
        if call.capped and over > 0:  # a backend past its max_tokens, or a prompt past the bound: counted
            error = f"the backend reported {over:,} token(s) more than the gateway reserved"
            logger.warning("%s: %s (prompt %d of %d, completion %d of %d)", model.model_name, error, prompt,
                           call.prompt_bound, completion, call.completion_held)
        self._record(grant, role, model, endpoint, t0, status=200, prompt=prompt, completion=completion,
                     error=error)
        output["model"] = model.model_name
        if stream:
            return web.Response(body=_sse(output, endpoint, include_usage), content_type="text/event-stream",
                                headers={"Cache-Control": "no-cache"})
        return web.json_response(output)

    async def _answer(self, request: web.Request, endpoint: str, call: _Call
                      ) -> tuple[dict[str, Any], bool, bool]:
        grant = call.grant
        assert grant is not None
        body, _ = await self._body(request)
        found = grant.resolve(body.get("model"))
        if found is None:
            raise _Refusal(*_not_granted_args(body.get("model")))
        call.role, call.model = found
        stream = bool(body.pop("stream", False))  # answered whole, as one event (see _sse)
        options = body.pop("stream_options", None)
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        spent = grant.exhausted()
        if spent is not None:
            raise _Refusal(429, spent, "budget_exceeded", "budget_exceeded", {"x-should-retry": "false"})
        call.reserve(grant, prompt_bound(endpoint, body), body)  # or refused: no backend call
        backend = call.model.backend
        try:
            async with self._queue(backend).slot(grant.run_id):
                output = await (backend.chat if endpoint == "chat" else backend.complete)(body)
        except BackendError as e:
            call.started = e.status == 504  # refused upstream, nothing spent, unless it timed out
            raise _Refusal(e.status, e.message, e.type, e.type) from None
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as e:
            call.started = False
            logger.exception("the backend of %s failed", call.model.model_name)
            raise _Refusal(502, f"the backend of {call.model.model_name} failed ({type(e).__name__})",
                           "upstream_error", "upstream_error") from None
        call.started = False
        if not isinstance(output, dict):
            raise _Refusal(502, f"the backend of {call.model.model_name} gave no response object",
                           "upstream_error", "upstream_error")
        return output, stream, include_usage

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


def _json_bytes(value: object) -> int:
    """Bytes of a JSON value written compactly, strings unescaped (UTF-8): at least the bytes of every
    string in it and of the structure around them (a walk without recursion: the body may nest as deep
    as the JSON parser allowed)."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += 2 + len(v.encode("utf-8", "surrogatepass"))  # JSON may carry lone surrogates
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)  # braces, a colon and a comma an entry
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            total += 2 + len(v)
            stack.extend(v)
        else:
            total += len(json.dumps(v))  # numbers, true, false, null
    return total


def prompt_bound(endpoint: str, body: dict[str, Any]) -> int:
    """An upper bound on the request's prompt tokens that the gateway computes offline, for any model
    whose tokens cover at least one byte (see PROMPT_TOKENS_PER_MESSAGE): the bytes of the request as
    JSON (every message's text with its fields, tools, and any field a backend might render), plus the
    template's tokens per message (per prompt of a text completion: its BOS), per request and for tools.
    A text completion's prompt given as token ids counts one a token. Content parts other than text
    (images, audio) cost what the provider decides: refused."""
    total, rest = PROMPT_TOKENS_PER_REQUEST, dict(body)
    if endpoint == "chat":
        messages = rest.pop("messages", None)
        messages = messages if isinstance(messages, list) else [messages]
        for m in messages:
            parts = m.get("content") if isinstance(m, dict) else None
            if isinstance(parts, list) and any(not isinstance(p, dict) or p.get("type") != "text"
                                               for p in parts):
                raise _Refusal(400, "only text content parts are supported through the gateway (what an "
                               "image or audio part costs has no bound the budget can hold)",
                               "invalid_request_error", "unsupported_content")
            total += PROMPT_TOKENS_PER_MESSAGE + _json_bytes(m)
    else:
        prompt = rest.pop("prompt", None)
        ids = isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)
        prompts = prompt if isinstance(prompt, list) and not ids else [prompt]
        for p in prompts:
            ids = isinstance(p, list) and all(isinstance(t, int) for t in p)
            total += PROMPT_TOKENS_PER_MESSAGE + (len(p) if ids else _json_bytes(p))
    if rest.get("tools") or rest.get("functions"):
        total += PROMPT_TOKENS_FOR_TOOLS
    return total + _json_bytes(rest)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _Refusal(400, f"'{key}' must be a positive integer", "invalid_request_error", "invalid_value")
    return value


def _limit(body: dict[str, Any], room: int | None, prompt: int, budget: str) -> int:
    """Check `n` and the completion caps, cap the completion at the budget's `room` (completion tokens
    left once the prompt's bound is taken off; None: no limit) shared among the choices, and give the
    completion tokens the request holds while in flight. Under a budget the cap is always imposed (as
    `max_tokens`, `CAP_UNASKED` when none was asked), so that nothing past it can be written."""
    for key in ("n_predict", "best_of"):  # llama.cpp's own cap, vLLM's hidden choices: neither metered
        if body.get(key) is not None and body.get(key) != 1:
            raise _Refusal(400, f"'{key}' is not supported by the gateway (use max_tokens and n)",
                           "invalid_request_error", "unsupported_parameter")
    if "chat_template" in body:  # vLLM's template of the request's own: a program that can repeat the text
        raise _Refusal(400, "'chat_template' is not supported by the gateway (its prompt could not be "
                       "bounded)", "invalid_request_error", "unsupported_parameter")
    n = _positive_int(body, "n") or 1
    prompts = body.get("prompt")  # text completions take a batch of prompts: `n` choices each
    if isinstance(prompts, list) and prompts and all(isinstance(p, str | list) for p in prompts):
        n *= len(prompts)
    if n > MAX_CHOICES:
        raise _Refusal(400, f"'n' (times the prompts of a batch) is at most {MAX_CHOICES} through the "
                       "gateway", "invalid_request_error", "invalid_value")
    echo = body.get("echo") is True and body.get("max_tokens") == 0  # the prompt's log-probabilities alone
    caps = {} if echo else {k: v for k in ("max_tokens", "max_completion_tokens")
                            if (v := _positive_int(body, k))}
    if room is not None and room < (0 if echo else n):
        raise _Refusal(429, f"budget exceeded: this request may take {prompt:,} prompt tokens (a bound: "
                       f"the bytes of its text) and {0 if echo else n} completion token(s) at the least, "
                       f"more than what remains of {budget} besides what its requests in flight hold",
                       "budget_exceeded", "budget_exceeded", {"x-should-retry": "false"})
    if echo or room is None:
        return 0
    asked = min(caps.values()) if caps else CAP_UNASKED
    cap = min(asked, room // n)
    for key in caps or ("max_tokens",):
        body[key] = cap
    return cap * n


def _too_large(limit: int) -> _Refusal:
    return _Refusal(413, f"the request body is larger than the gateway's limit of {limit:,} bytes",
                    "invalid_request_error", "request_too_large")


def _not_granted_args(name: object) -> tuple[int, str, str, str]:
    if name is None:
        return (400, "the request names no model ('model' is required)", "invalid_request_error",
                "model_required")
    return (404, f"The model {str(name)[:200]!r} does not exist or you do not have access to it.",
            "invalid_request_error", "model_not_found")


def _not_granted(name: object) -> web.Response:
    return error_response(*_not_granted_args(name))


def _sse(output: dict[str, Any], endpoint: str, include_usage: bool) -> bytes:
    """A whole answer as a server-sent event stream: one chunk with every choice, then usage if asked."""
    head = {"id": output.get("id") or f"gw-{uuid.uuid4().hex}", "created": output.get("created", 0),
            "model": output["model"]}
    choices = []
    for i, c in enumerate(output.get("choices") or []):
        if endpoint == "chat":
            message = dict(c.get("message") or {})
            for n, call in enumerate(message.get("tool_calls") or []):
                call["index"] = n
            choices.append({"index": c.get("index", i), "delta": {k: v for k, v in message.items()
                                                                  if v is not None},
                            "logprobs": c.get("logprobs"), "finish_reason": c.get("finish_reason")})
        else:
            choices.append(c)
    kind = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    events = [{**head, "object": kind, "choices": choices}]
    if include_usage:
        events.append({**head, "object": kind, "choices": [], "usage": output.get("usage")})
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


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


class _GrantSite(web.BaseSite):
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
