"""One local model server shared by every user, in this process and others, while any of them needs it:
the state file, the per-process leases and the count of users here. Apart from the server itself
(`_local.py`), which knows nothing of who shares it."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from openrebench.base import cache_dir

from ._local import (
    API_KEY_ENV,
    BASE_URL_ENV,
    MODEL_NAME,
    LocalModelServer,
    _alive,
    _healthy,
    _live_users,
    _read_state,
    _start_time,
)
from ._local_file import _flock, _gguf_package, local_model_path

OPEN_SERVER = "local-model"
"""The server of the agent's side: its own model (`--model local`) and its grants' calls."""
HELD_OUT_SERVER = "local-model-held-out"
"""Where the servers of scorings and set-up builds, whose prompts carry held-out data, log: each such grant
gets a server of its own (`ModelService`), never shared. llama.cpp keeps recent prompts (a slot's KV
cache, its prompt cache in RAM) and says how much of a new prompt it found there (`cached_tokens`, and a
faster answer), so a server that anything else reaches would let it test guesses of held-out text."""


@dataclass(frozen=True)
class LocalEndpoint:
    """Where the shared server answers, and the key it wants (a Bearer token, as OpenAI clients send)."""

    base_url: str
    api_key: str
    model: str = MODEL_NAME
    parallel: int = 4  # the server's slots: requests it serves at once

    def inspect_env(self) -> dict[str, str]:
        """The variables with which Inspect's `openai-api/local/...` provider reaches this server."""
        return {BASE_URL_ENV: self.base_url, API_KEY_ENV: self.api_key}


@dataclass
class _Share:
    endpoint: LocalEndpoint
    pid: int
    started: float
    users: int
    server: LocalModelServer | None  # None: a server another process started


_shares: dict[Path, _Share] = {}
_shares_lock = threading.Lock()


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    partial = folder / f".server.json.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the API key
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(partial, folder / "server.json")


def _usable(state: dict[str, Any] | None, model_sha256: str) -> bool:
    """Whether the state file names a live server of this model that answers."""
    try:
        return (state is not None and state["model_sha256"] == model_sha256
                and _alive(int(state["pid"]), float(state["started"]))
                and _healthy(f"http://127.0.0.1:{int(state['port'])}"))
    except (KeyError, TypeError, ValueError):
        return False


def _terminate(pid: int, started: float) -> None:
    if not _alive(pid, started):
        return
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        proc.terminate()
        try:
            proc.wait(10)
        except psutil.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def shared_local_server(cache: Path | None = None, **options: Any) -> Iterator[LocalEndpoint]:
    """One local model server for every user, in this process and others, while any of them needs it.

    The first user starts it; later ones in this process share it (a count), and other processes find
    it through `<cache>/local-model/server.json` (pid, port, key, model sha; read and written under
    `server.lock`), reusing it if its pid lives and it answers. Each process using it holds a lease in
    `local-model/users/`. The last user to leave, whichever process it is in, stops it; a server whose
    leaseholders all died stops itself; a state file whose server is gone is replaced. `options` go to
    `LocalModelServer` when this call starts the server (a running one is reused as it is).
    """
    folder = (cache or cache_dir()) / OPEN_SERVER
    endpoint = _acquire(folder, cache, options)
    try:
        yield endpoint
    finally:
        _release(folder)


def _acquire(folder: Path, cache: Path | None, options: dict[str, Any]) -> LocalEndpoint:
    with _shares_lock:
        share = _shares.get(folder)
        if share is not None and _alive(share.pid, share.started):
            share.users += 1
            return share.endpoint
        if share is not None and share.server is not None:
            share.server.stop()  # died under us: reap it
        users = (share.users if share else 0) + 1
        model = local_model_path(cache)
        expected = _gguf_package().EXPECTED_SHA256
        (folder / "users").mkdir(parents=True, exist_ok=True)
        lease = folder / "users" / str(os.getpid())
        with _flock(folder / "server.lock"):
            lease.write_text(repr(_start_time(os.getpid())))
            state = _read_state(folder)
            server = None
            if not _usable(state, expected):
                if state is not None:
                    with contextlib.suppress(KeyError, TypeError, ValueError):
                        _terminate(int(state["pid"]), float(state["started"]))  # alive but not answering
                try:
                    server = LocalModelServer(model, log_dir=folder / "logs", users_dir=folder / "users",
                                              **options).start()
                except BaseException:
                    if share is None:  # no user here: no lease to keep another process's server alive
                        lease.unlink(missing_ok=True)
                    raise
                assert server.pid is not None and server.port is not None
                state = {"pid": server.pid, "started": _start_time(server.pid), "port": server.port,
                         "api_key": server.api_key, "model_sha256": expected, "model": str(model),
                         "owner_pid": os.getpid(), "parallel": server.parallel}
                _write_state(folder, state)
        endpoint = LocalEndpoint(f"http://127.0.0.1:{state['port']}/v1", state["api_key"],
                                 parallel=int(state.get("parallel") or 4))
        _shares[folder] = _Share(endpoint, state["pid"], state["started"], users, server)
        return endpoint


def _release(folder: Path) -> None:
    with _shares_lock:
        share = _shares.get(folder)
        if share is None:
            return
        share.users -= 1
        if share.users > 0:
            return
        del _shares[folder]
        with _flock(folder / "server.lock"):
            (folder / "users" / str(os.getpid())).unlink(missing_ok=True)
            if _live_users(folder / "users"):
                return  # others still use it; it stops itself once they are gone
            if share.server is not None:
                share.server.stop()
            else:
                _terminate(share.pid, share.started)
            state = _read_state(folder)
            if state is not None and state.get("pid") == share.pid:
                (folder / "server.json").unlink(missing_ok=True)


@atexit.register
def _release_all() -> None:
    """A backstop for users that never left (a generator not closed, an exception past the harness)."""
    for folder, share in list(_shares.items()):
        share.users = 1
        _release(folder)
