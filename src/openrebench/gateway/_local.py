"""The offline default model: Gemma 3 270M (Q4_K_M GGUF) served by llama.cpp's server through xllamacpp.

Real users have API keys and GPUs; CI and laptops have neither, so the gateway can fall back to this.
It is a small *base* model (its GGUF carries no chat template): `/v1/completions`, or a short and
simple chat prompt, suits it; it will not follow an agent's tool protocol. For chat we give llama.cpp
Gemma's turn format, made lenient (every role but the assistant's is a user turn, no alternation is
enforced) so that no transcript makes the template raise; without it llama.cpp falls back to ChatML,
whose `<|im_end|>` the model spells out as text and never stops on.

Harness side. The server runs in a child process (`python -m openrebench.gateway._local serve ...`):
llama.cpp's threads do not contend for the harness's GIL, and the process can be killed whole. It
listens on 127.0.0.1 on a port the kernel picks (no race between choosing and binding) and demands a
random API key, so that a sandboxed agent that can reach the host's loopback cannot use it around
the gateway's meter. The model file is assembled by `_local_file.py`; one server is shared among the
harness's users, in this process and others, by `_local_share.py`.

What llama.cpp serves (xllamacpp 2026.10.11549): `/health` (without the key), `/v1/models`,
`/v1/completions` (`logprobs: N` gives the top N per token, in the chat shape `content[].top_logprobs`),
`/v1/chat/completions` (`logprobs`/`top_logprobs`), both with `usage`; also `/tokenize`,
`/apply-template`, `/props`. Both take `n` up to the number of slots (more is a 400), but then `usage`
counts the completion tokens of one choice only: a meter must not trust it for `n` > 1.
Measured on a 2-core CPU shared with a running test suite (load 4): the server answers 2.3-6 s after
spawning, an 8-token completion takes 0.6-4.7 s (median 2.5 s), and the process holds 0.5 GB
(weights 0.25 GB, four 4096-token slots).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from openrebench.base import OpenRebenchError, cache_dir, usable_cores

from ._local_file import local_model_path

MODEL_NAME = "gemma-3-270m"
"""The name the server answers to (`model` in requests, `/v1/models`)."""
INSPECT_MODEL = f"openai-api/local/{MODEL_NAME}"
"""Inspect's OpenAI-compatible provider, service `local`: it reads LOCAL_BASE_URL and LOCAL_API_KEY."""
INSPECT_COMPLETIONS_MODEL = f"openai-api-completions/local/{MODEL_NAME}"
"""The same through `/v1/completions` (one user message as a raw prompt): the base model's natural use."""
BASE_URL_ENV = "LOCAL_BASE_URL"
API_KEY_ENV = "LOCAL_API_KEY"
# The key reaches the child through its environment: its argv is readable by every user (ps).
_KEY_ENV = "OPENREBENCH_LOCAL_MODEL_KEY"

# Gemma's turns; bos_token is written by the template and llama.cpp drops it before adding its own.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = 'user' -%}"
    "{%- endif -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- elif message['content'] -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


def default_threads() -> int:
    """At most 4: a 270M model gains little beyond, and the harness and scorer need cores too."""
    return usable_cores(at_most=4)


# ---------------------------------------------------------------------------------------- one server

def _alive(pid: int, started: float | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, given its start time, is still the same process."""
    try:
        proc = psutil.Process(pid)
        same = started is None or abs(proc.create_time() - started) < 1
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _start_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(root: str, timeout: float = 5.0) -> bool:
    try:
        with _NO_PROXY.open(f"{root}/health", timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


class LocalModelServer:
    """llama.cpp's OpenAI-compatible server for one GGUF, in a child process on 127.0.0.1.

    Defaults suit a 2-core CPU: `threads` = min(4, cores); `parallel` slots of `context` tokens each
    (4 x 4096; Gemma 3 keeps full attention in 3 of its 18 layers, so the KV cache is small);
    `max_tokens` caps every reply, as the base model rarely stops by itself. The child stops when this
    process goes, or, given `users_dir` (a folder of per-process leases, see `shared_local_server`),
    when no leaseholder lives. Its log is kept when it fails, removed when it stops cleanly.
    """

    def __init__(self, model: Path | None = None, *, threads: int | None = None, context: int = 4096,
                 parallel: int = 4, max_tokens: int = 1024, api_key: str | None = None,
                 log_dir: Path | None = None, startup_timeout: float = 120.0,
                 users_dir: Path | None = None) -> None:
        self.model = model
        self.threads = threads or default_threads()
        self.context, self.parallel, self.max_tokens = context, parallel, max_tokens
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.log_dir = log_dir
        self.startup_timeout = startup_timeout
        self.users_dir = users_dir
        self.port: int | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise OpenRebenchError("the local model server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalModelServer:
        """Spawn the server and wait until it answers `/health`; a one-line error if it does not."""
        if self._proc is not None:
            return self
        model = self.model = self.model or local_model_path()
        if not model.is_file():
            raise OpenRebenchError(f"no model file at {model}")
        log_dir = self.log_dir or cache_dir() / "local-model" / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        fd, log_name = tempfile.mkstemp(prefix="server-", suffix=".log", dir=log_dir)
        self.log_path = Path(log_name)
        ready = self.log_path.with_suffix(".ready")
        command = [sys.executable, "-m", "openrebench.gateway._local", "serve", "--model", str(model),
                   "--threads", str(self.threads), "--context", str(self.context),
                   "--parallel", str(self.parallel), "--max-tokens", str(self.max_tokens),
                   "--ready-file", str(ready), "--log", log_name]
        command += ["--users", str(self.users_dir)] if self.users_dir else ["--parent", str(os.getpid())]
        with os.fdopen(fd, "wb") as log:
            # Its own session: a Ctrl-C meant for this process must not reach a server others may share.
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          env={**os.environ, _KEY_ENV: self.api_key}, start_new_session=True,
                                          stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout
        while not ready.exists():
            if self._proc.poll() is not None:
                raise self._failure(f"exited (code {self._proc.returncode}) while loading {model.name}")
            if time.monotonic() > deadline:
                failure = self._failure(f"did not start within {self.startup_timeout:.0f} s")
                self.stop()
                raise failure
            time.sleep(0.05)
        self.port = json.loads(ready.read_text())["port"]
        ready.unlink()
        if not _healthy(self.base_url.removesuffix("/v1")):
            failure = self._failure(f"loaded {model.name} but does not answer /health on port {self.port}")
            self.stop()
            raise failure
        return self

    def check(self) -> None:
        """Raise a one-line error if the server has died since it started."""
        if self._proc is not None and self._proc.poll() is not None:
            raise self._failure(f"died (exit code {self._proc.returncode})")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _failure(self, what: str) -> OpenRebenchError:
        cause = _first_error(self.log_path)
        return OpenRebenchError(f"the local model server {what}: {cause} (log: {self.log_path})")


# llama.cpp's log lines read "0.00.008.477 E gguf_init_from_reader: invalid magic ..."; ours "error: ...".
_ERROR_LINE = re.compile(r"^(?:[\d.]+ E |error: )(.*)$")


def _first_error(log: Path | None) -> str:
    """The first error line of the server's log: the cause (later ones are its consequences)."""
    try:
        lines = log.read_text(errors="replace").splitlines() if log else []
    except OSError:
        lines = []
    for line in lines:
        if match := _ERROR_LINE.match(line.strip()):
            return match.group(1).strip()
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1] if tail else "no output"


# ---------------------------------------------------------------------------------------- shared state
# The shared server's state file and leases (`_local_share.py`), which the child reads too.

def _read_state(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "server.json").read_text())
    except (OSError, ValueError):
        return None


def _live_users(users: Path) -> list[int]:
    """The pids holding a lease in `users` (a file per process, holding its start time); stale ones go."""
    live = []
    for lease in users.glob("*"):
        with contextlib.suppress(OSError, ValueError):
            pid, started = int(lease.name), float(lease.read_text())
            if _alive(pid, started):
                live.append(pid)
            else:
                lease.unlink(missing_ok=True)
    return live


# ---------------------------------------------------------------------------------------- the child

def _no_users_left(folder: Path) -> bool:
    """In the child: whether every leaseholder is gone (then it clears the state, under the lock)."""
    with open(folder / "server.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # someone is joining or leaving: look again next time
        if _live_users(folder / "users"):
            return False
        state = _read_state(folder)
        if state is not None and state.get("pid") == os.getpid():
            (folder / "server.json").unlink(missing_ok=True)
        return True


def _serve(args: argparse.Namespace) -> int:
    try:
        with open(args.model, "rb") as f:
            head = f.read(4)
    except OSError as e:
        print(f"error: cannot read {args.model}: {e.strerror}", file=sys.stderr, flush=True)
        return 1
    if head != b"GGUF":  # said here, not left to llama.cpp, whose log thread may not write before we exit
        print(f"error: invalid magic {head!r}: {args.model} is not a GGUF file", file=sys.stderr, flush=True)
        return 1
    import xllamacpp

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {MODEL_NAME}
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the kernel picks a free port; we report it
    params.api_keys = [os.environ[_KEY_ENV]]
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = args.parallel
    params.n_ctx = args.context * args.parallel  # llama.cpp splits n_ctx evenly among the slots
    params.n_predict = args.max_tokens
    params.chat_template = CHAT_TEMPLATE
    params.cache_ram_mib = 256  # the prompt cache: llama.cpp's default of 8 GiB is a laptop's memory
    params.ui = False
    try:
        server = xllamacpp.Server(params)  # returns once the model is loaded and the port bound
    except RuntimeError as e:
        time.sleep(0.5)  # llama.cpp logs the cause from a thread of its own: let it write it first
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    port = int(server.listening_address.rsplit(":", 1)[1])
    ready = Path(args.ready_file)
    partial = ready.with_suffix(".partial")
    partial.write_text(json.dumps({"port": port}))
    partial.rename(ready)
    folder = Path(args.users).parent if args.users else None
    while not stop.wait(1.0):
        if _no_users_left(folder) if folder is not None else os.getppid() != args.parent:
            break
    del server  # llama.cpp's destructor joins its threads and closes the port
    if args.log:
        Path(args.log).unlink(missing_ok=True)
    return 0


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrebench.gateway._local")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help=f"run llama.cpp's server (its API key comes in {_KEY_ENV})")
    serve.add_argument("--model", required=True)
    serve.add_argument("--threads", type=int, default=default_threads())
    serve.add_argument("--context", type=int, default=4096, help="tokens per slot")
    serve.add_argument("--parallel", type=int, default=4)
    serve.add_argument("--max-tokens", type=int, default=1024)
    serve.add_argument("--ready-file", required=True, help="where to write {'port': N} once serving")
    serve.add_argument("--log", help="this server's log, removed when it stops cleanly")
    owner = serve.add_mutually_exclusive_group(required=True)
    owner.add_argument("--parent", type=int, help="stop when this process (our parent) is gone")
    owner.add_argument("--users", help="stop when no process holding a lease in this folder lives")
    return _serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_main())
