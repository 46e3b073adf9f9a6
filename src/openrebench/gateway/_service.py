"""The harness's one gateway: a process-wide service serving every run's grants from one Unix socket.

Made on first use (`model_service()`), it serves from a thread of the harness (`GatewayThread`) on
`<tmp>/openrebench-gateway-XXXX/public/gateway.sock`. The top folder is the harness user's alone (mode
700), so no other user of the machine reaches the socket; a sandbox is shown the `public` folder
alone, bound in (a folder, not the socket file: a restarted gateway's new socket shows through it).

A model spec is what an environment's role names (`ModelRole.model`): `local` is the offline Gemma
server (`shared_local_server`, held while a live grant names it), anything else an Inspect model
(`openai/gpt-4o-mini`, `mockllm/model`). Backends are made once per spec. A grant on held-out data
(a scoring, a set-up build: `held_out=True`) reaches `local` through a server of its own, started for it
and stopped when it is revoked: llama.cpp keeps recent prompts and says how much of a new one it found
kept, so a server shared with the agent's side, or with another scoring, would let the code that can
reach it test guesses of a held-out prompt another grant had sent.

A gateway thread that died is started again on the same socket path by the next `grant` or `ensure`
(the harness calls it before each of the agent's commands and each scoring), with every live grant
registered again under its token: the usage logs are the budgets' memory, so nothing spent is lost.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import secrets
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openrebench.api import LOCAL_MODEL
from openrebench.base import OpenRebenchError, cache_dir

from ._backends import BackendUnavailable, ModelBackend, OpenAICompatibleBackend
from ._inspect import InspectBackend
from ._likelihood import Likelihood, LocalModelBackend
from ._local import MODEL_NAME, LocalModelServer
from ._local_share import HELD_OUT_SERVER, LocalEndpoint, shared_local_server
from ._server import Budget, Gateway, GatewayThread, Grant, RoleModel

logger = logging.getLogger(__name__)

SOCKET_NAME = "gateway.sock"
USAGE_LOG = Path("gateway") / "usage.jsonl"
"""Where in a run's directory its usage log lies."""
FREE = {"input": 0.0, "output": 0.0}
OWN_HELD_OUT_SERVERS = True
"""Each held-out grant's `local` is a server of its own (False: the agent's side's shared one; the red
team's `held-out-server` switch)."""


@dataclass(frozen=True)
class _Live:
    """What a grant was made of, to make it again on a restarted gateway."""

    token: str = field(repr=False)
    models: dict[str, str]
    usage_path: Path
    budget: Budget
    run_id: str
    phase: str | None
    socket_path: Path  # the grant's own socket (kept over restarts: a sandbox binds its folder)
    held_out: bool = False  # its calls carry held-out data: the offline model's held-out server


class ModelService:
    """One gateway for the whole process, its backends, and the grants it serves.

    `root`: the folder the private one is made in (default: the system's temporary folder). `prices`:
    US$ per 1M tokens by model name, over the price table (`load_prices`).
    """

    def __init__(self, root: Path | None = None, *,
                 prices: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self._parent = root
        self.prices = prices
        self._lock = threading.RLock()
        self._root: Path | None = None
        self._thread: GatewayThread | None = None
        self._models: dict[tuple[str, bool], RoleModel] = {}  # by (spec, held out), for the serving loop
        self._custom: dict[str, RoleModel] = {}  # by spec, added by `add_backend`: kept over restarts
        self._live: dict[str, _Live] = {}  # by token
        self._grants: dict[str, Grant] = {}  # by token: the serving gateway's
        self._local = contextlib.ExitStack()  # the shared server of the agent's side, while held
        self._endpoint: LocalEndpoint | None = None
        self._held: dict[str, tuple[_OwnServer, RoleModel]] = {}  # by token: held-out grants' own servers
        self._likelihood = Likelihood()  # the offline model's echo, loaded on its first request
        self._keeping = 0  # `keep_local` holds: the offline model stays between grants while any is held
        self._closed = False
        self.restarts = 0

    # -- where ----------------------------------------------------------------------------------------

    @property
    def socket_dir(self) -> Path:
        """The folder holding the socket: what a sandbox binds (at a path of its own)."""
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="openrebench-gateway-", dir=self._parent))
                self._root.chmod(0o700)
                (self._root / "public").mkdir(mode=0o755)
            return self._root / "public"

    @property
    def socket_path(self) -> Path:
        """The shared socket (any grant's token): for the harness's own clients, never a sandbox's."""
        return self.socket_dir / SOCKET_NAME

    def _new_socket_path(self) -> Path:
        """A folder of its own for a grant's socket, beside the shared one's."""
        top = self.socket_dir.parent / "grants"
        top.mkdir(mode=0o755, exist_ok=True)
        folder = top / secrets.token_hex(8)
        folder.mkdir(mode=0o755)
        return folder / SOCKET_NAME

    # -- backends -------------------------------------------------------------------------------------

    def role_model(self, spec: str) -> RoleModel:
        """The backend, name and price behind a model spec (`local`, or an Inspect model name), as the
        agent's side reaches it: `local` is the shared server."""
        with self._lock:
            if spec in self._custom:
                return self._custom[spec]
            found = self._models.get(spec)
            if found is None:
                if spec == LOCAL_MODEL:
                    e = self._endpoint
                    if e is None:
                        e = self._endpoint = self._local.enter_context(shared_local_server())
                    upstream = OpenAICompatibleBackend(e.base_url, e.model, e.api_key,
                                                       usage_counts_one_choice=True, capacity=e.parallel)
                    found = RoleModel(LocalModelBackend(upstream, self._likelihood), e.model, FREE)
                else:
                    found = RoleModel(InspectBackend(spec), spec)
                self._models[spec] = found
            return found

    def _held_out_model(self, token: str) -> RoleModel:
        """`local` for one held-out grant: a server of the grant's own (`_OwnServer`), stopped at
        `revoke`; kept over a restart of the gateway."""
        found = self._held.get(token)
        if found is None:
            own = _OwnServer()
            found = self._held[token] = (own, RoleModel(LocalModelBackend(own, self._likelihood), MODEL_NAME,
                                                        FREE))
        return found[1]

    def _own_server(self, live: _Live, spec: str) -> bool:
        """Whether `spec` reaches a server of the grant's own: the offline model on held-out data."""
        return live.held_out and spec == LOCAL_MODEL and spec not in self._custom and OWN_HELD_OUT_SERVERS

    def _model_of(self, live: _Live, spec: str) -> RoleModel:
        return self._held_out_model(live.token) if self._own_server(live, spec) else self.role_model(spec)

    def answers(self, token: str, role: str, endpoint: str, timeout_s: float = 120.0) -> bool:
        """Whether the backend behind a live grant's `role` serves the harness's own known-good request on
        `endpoint` ("chat" or "completions", the offline model's echo too) now, nothing metered: where it
        does, calls of the grant that failed were their own requests' doing, not the backend's."""
        with self._lock:
            live, thread = self._live.get(token), self._thread
            if live is None or thread is None or role not in live.models:
                return False
            model = self._model_of(live, live.models[role])

        async def probe() -> bool:
            backend, name = model.backend, model.model_name
            if isinstance(backend, LocalModelBackend):
                # The offline model: its server's health check, which llama.cpp answers however busy its
                # slots are, and the echo's weights loaded (a request would queue behind what the scoring
                # left running, for as long as it chose: a wait to time out, which it could choose too).
                upstream = getattr(backend.upstream, "healthy", None)
                served = upstream is None or await upstream()
                echo = endpoint == "completions"
                return served and (not echo or await asyncio.to_thread(backend.likelihood.ready))
            if endpoint != "completions":
                answer = await backend.chat({"model": name, "max_tokens": 1,
                                             "messages": [{"role": "user", "content": "Say hello."}]})
                return isinstance(answer.get("choices"), list)
            answer = await backend.complete({"model": name, "prompt": "Hello", "max_tokens": 1})
            return isinstance(answer.get("choices"), list)

        try:
            return thread.run(probe(), timeout_s)
        except Exception:  # any failure of the probe is the backend's
            return False

    def model_name(self, spec: str) -> str:
        """The name clients see for a model spec, without starting its backend."""
        with self._lock:
            if spec in self._custom:
                return self._custom[spec].model_name
        return MODEL_NAME if spec == LOCAL_MODEL else spec

    def add_backend(self, spec: str, backend: ModelBackend, model_name: str | None = None,
                    price: Mapping[str, float] | None = None) -> None:
        """Serve `spec` from `backend` (a server of one's own; tests): grants made after use it."""
        with self._lock:
            self._custom[spec] = RoleModel(backend, model_name or spec, price)

    # -- the gateway ----------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the gateway's thread serves (and its socket is in place)."""
        thread = self._thread
        return thread is not None and thread.alive and self.socket_path.exists()

    def ensure(self) -> bool:
        """Start the gateway if it does not serve (first use, or its thread died), with every live grant
        registered again; True when it was started now."""
        if self.alive:
            return False
        with self._lock:
            if self._closed:
                raise OpenRebenchError("the model gateway has been closed")
            if self.alive:
                return False
            restart = self._thread is not None
            if restart:
                with contextlib.suppress(Exception):
                    self._thread.stop()  # type: ignore[union-attr]
                # Inspect's providers are bound to the dead thread's event loop: new ones for the new.
                self._models.clear()
            self._thread = GatewayThread(Gateway(self.socket_path, prices=self.prices)).start()
            self._grants = {token: self._register(live) for token, live in self._live.items()}
            if restart:
                self.restarts += 1
                logger.warning("the model gateway had stopped: started again on %s with %d grant(s)",
                               self.socket_path, len(self._grants))
            return True

    def _register(self, live: _Live) -> Grant:
        assert self._thread is not None
        roles = {role: self._model_of(live, spec) for role, spec in live.models.items()}
        return self._thread.gateway.grant(live.token, roles=roles, usage_path=live.usage_path,
                                          budget=live.budget, run_id=live.run_id, phase=live.phase,
                                          socket_path=live.socket_path)

    def grant(self, run_path: Path, models: Mapping[str, str], budget: Budget | None = None, *,
              phase: str | None = None, run_id: str | None = None, held_out: bool = False) -> Grant:
        """Let a new token use `models` (role: spec) within `budget`, logging to the run's
        `gateway/usage.jsonl`; each grant spends its own budget (the rows of its `run_id`). The grant's
        own socket (`Grant.socket_dir`) is what a sandbox is shown. `held_out`: its calls carry held-out
        data (a scoring, a build): `local` is a server of the grant's own, which nothing else reaches."""
        with self._lock:
            live = _Live(secrets.token_urlsafe(32), dict(models), Path(run_path) / USAGE_LOG,
                         budget or Budget(), run_id or Path(run_path).name, phase, self._new_socket_path(),
                         held_out)
            self.ensure()
            grant = self._register(live)
            self._live[live.token] = live
            self._grants[live.token] = grant
        return grant

    def current(self, token: str) -> Grant | None:
        """The serving gateway's grant of `token` (a new object after a restart), or None."""
        return self._grants.get(token)

    def revoke(self, token: str) -> None:
        """The token no longer opens anything, now or after a restart."""
        with self._lock:
            live = self._live.pop(token, None)
            self._grants.pop(token, None)
            if self._thread is not None:
                self._thread.gateway.revoke(token)
            if live is not None:
                live.socket_path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    live.socket_path.parent.rmdir()
            self._stop_held_out(token)
            self._release_local()

    def _stop_held_out(self, token: str) -> None:
        found = self._held.pop(token, None)
        if found is not None:
            if self._thread is not None:
                self._thread.gateway.forget(found[1].backend)
            found[0].stop()

    @contextlib.contextmanager
    def keep_local(self) -> Iterator[None]:
        """Keep the offline model (the agent's side's server and the judge's weights) between this
        process's grants while the context is held: an eval of several runs whose environments use it would
        otherwise start the server and load the weights again for every run. Let go at the end as usual.
        (A held-out grant's own server goes with its grant whatever is kept.)"""
        with self._lock:
            self._keeping += 1
        try:
            yield
        finally:
            with self._lock:
                self._keeping -= 1
                self._release_local()

    def _release_local(self) -> None:
        """Let the agent's side's local model server go once no live grant that reaches it remains and
        nothing keeps it (`keep_local`): it is shared, so it stops only when no other user (an agent's
        `--model local`, another process) holds it either. The judge's weights go once no server of ours
        is left."""
        if self._keeping:
            return
        if self._endpoint is not None and not any(
                LOCAL_MODEL in live.models.values() and not self._own_server(live, LOCAL_MODEL)
                for live in self._live.values()):
            found = self._models.pop(LOCAL_MODEL, None)
            if found is not None and self._thread is not None:
                self._thread.gateway.forget(found.backend)
            self._local.close()
            self._local = contextlib.ExitStack()
            self._endpoint = None
        if self._endpoint is None and not self._held:
            self._likelihood.unload()

    def stop(self) -> None:
        """Stop serving (as a crash would, but cleanly): the next `ensure` starts it again."""
        with self._lock:
            if self._thread is not None:
                self._thread.stop()

    def close(self) -> None:
        """Stop the gateway, let the local model go, remove the private folder."""
        with self._lock:
            self._closed = True
            if self._thread is not None:
                with contextlib.suppress(Exception):
                    self._thread.stop()
                self._thread = None
            for own, _ in self._held.values():
                own.stop()
            self._held.clear()
            self._local.close()
            self._endpoint = None
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)


class _OwnServer:
    """A held-out grant's own llama.cpp server, started by the first request that needs it (about two
    seconds once the model file is in the page cache; an echo needs none, the judge's weights answer it)
    and stopped with the grant. Stands in for the upstream of `LocalModelBackend`."""

    name = MODEL_NAME
    usage_counts_one_choice = True

    def __init__(self) -> None:
        self._server = LocalModelServer(log_dir=cache_dir() / HELD_OUT_SERVER / "logs")
        self.capacity = self._server.parallel
        self._lock = threading.Lock()  # one start, and no stop in the middle of it
        self._upstream: OpenAICompatibleBackend | None = None
        self._stopped = False

    def _started(self) -> OpenAICompatibleBackend:
        with self._lock:
            if self._stopped:
                raise BackendUnavailable("the scoring's model server has been stopped (its grant ended)")
            if self._upstream is None:
                try:
                    server = self._server.start()
                except OpenRebenchError as e:
                    raise BackendUnavailable(str(e)) from None
                self._upstream = OpenAICompatibleBackend(server.base_url, MODEL_NAME, server.api_key,
                                                         usage_counts_one_choice=True, capacity=self.capacity)
            return self._upstream

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await (await asyncio.to_thread(self._started)).chat(body)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return await (await asyncio.to_thread(self._started)).complete(body)

    async def stream(self, kind: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        upstream = await asyncio.to_thread(self._started)
        async for chunk in upstream.stream(kind, body):
            yield chunk

    async def healthy(self) -> bool:
        """Whether the server answers its health check, started for it if no request has yet."""
        try:
            upstream = await asyncio.to_thread(self._started)
        except BackendUnavailable:
            return False
        return await upstream.healthy()

    async def aclose(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._server.stop()


_service: ModelService | None = None
_service_lock = threading.Lock()


def model_service() -> ModelService:
    """The process's model service, made on first use and closed when the process exits."""
    global _service
    with _service_lock:
        if _service is None:
            _service = ModelService()
            atexit.register(_service.close)
        return _service
