"""Where the gateway's requests go: an OpenAI-compatible server (here), or a provider through Inspect
(`_inspect.py`).

Both take the client's OpenAI request body and give back an OpenAI response object with `usage`, the
only thing the gateway meters. Failures are `BackendError`s carrying the HTTP status the client gets,
so a provider's exception never reaches a client with the harness's details in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol, runtime_checkable

import aiohttp

from ._streaming import StreamFormatError, sse_data, whole_as_chunks

Body = dict[str, Any]


class BackendError(Exception):
    """A request the backend could not serve, with the status and OpenAI error type the client gets."""

    status = 502
    type = "upstream_error"

    def __init__(self, message: str, status: int | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type


class Unsupported(BackendError):
    """The backend has no such endpoint or feature (Inspect has no text completions, for one)."""

    status = 400
    type = "unsupported"


class BackendUnavailable(BackendError):
    """The backend cannot be reached or stayed overloaded: the client may try again later."""

    status = 503
    type = "backend_unavailable"


class BadRequest(BackendError):
    """The request is malformed for this backend (a message role it does not know, say)."""

    status = 400
    type = "invalid_request_error"


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def redact(text: str, *extra: str | None) -> str:
    """`text` with the harness's secrets (the values of its environment variables named like keys,
    and `extra`) replaced: a provider's error message may quote the key it was given."""
    secrets = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8}
    secrets.update(x for x in extra if x and len(x) >= 8)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text


@runtime_checkable
class ModelBackend(Protocol):
    """A model behind the gateway. `chat` answers a `chat.completion`, `complete` a `text_completion`.

    What else a backend can do it says by the attributes it has (the gateway looks them up, never at its
    class or name): `stream(kind, body)`, an async iterator of the OpenAI chunks of a streamed answer as
    they come (`kind`: "chat" or "completions"; without it a streamed request is answered whole, as
    one event); `check(kind, body)`, which raises `Unsupported` for a request it would not honour in full
    (a parameter it would ignore), before anything is held or sent; `max_choices`, the most `n` it takes;
    `capacity`, the requests it serves at once; `usage_counts_one_choice` (see OpenAICompatibleBackend).
    """

    async def chat(self, body: Body) -> Body: ...

    async def complete(self, body: Body) -> Body: ...


class OpenAICompatibleBackend:
    """An OpenAI-compatible server (llama.cpp, vLLM, a hosted API): requests forwarded as they came,
    with `model` rewritten to the upstream's name.

    Upstream 429 and 503 (busy, loading) are retried with exponential backoff, `retries` times; they are
    neither failures nor charged. Other upstream errors keep their 4xx status (the request was at fault)
    or become a 502 (the upstream was). The client is aiohttp's: through httpx's async client the
    gateway served about 150 requests/s from an upstream that answers at once, through aiohttp's about
    650 (benchmarks/gateway.py, 32 clients, a busy 2-core machine).
    """

    RETRY = (429, 503)

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, retries: int = 5,
                 backoff_s: float = 0.5, timeout_s: float = 600.0, usage_counts_one_choice: bool = False,
                 capacity: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.capacity = capacity  # requests the server serves at once (the gateway queues the rest fairly)
        # llama.cpp's server reports the completion tokens of one choice when asked for `n` > 1: the
        # gateway then charges that count once per choice, or `n` would buy choices for free.
        self.usage_counts_one_choice = usage_counts_one_choice
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()  # a session is bound to the loop it was made in
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = self._sessions[loop] = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=256), trust_env=True)  # HTTPS_PROXY, NO_PROXY
        return session

    async def aclose(self) -> None:
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def healthy(self) -> bool:
        """Whether the upstream answers `GET /health` (llama.cpp's and vLLM's, beside `/v1`) with a 200."""
        url = f"{self.base_url.removesuffix('/v1')}/health"
        try:
            async with self._session().get(url, headers=self._headers,
                                           timeout=aiohttp.ClientTimeout(total=5)) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """The client's failures to reach the upstream (or to hear it out) as the gateway's errors."""
        try:
            yield
        except TimeoutError as e:
            raise BackendUnavailable(f"the upstream {self.base_url} timed out", status=504,
                                     type="timeout") from e
        except aiohttp.ClientError as e:
            raise BackendUnavailable(f"the upstream {self.base_url} cannot be reached "
                                     f"({type(e).__name__})") from e

    async def _open(self, path: str, body: Body) -> aiohttp.ClientResponse:
        """POST `body` (as the upstream's model), retrying while the upstream is busy: its response, the
        body not read yet (a stream's is read as it comes)."""
        url, body = f"{self.base_url}{path}", {**body, "model": self.name}
        for attempt in range(self.retries + 1):
            with self._reaching():
                response = await self._session().post(url, json=body)
            if response.status not in self.RETRY or attempt == self.retries:
                break
            retry_after = response.headers.get("retry-after")
            response.release()
            wait = self.backoff_s * 2 ** attempt
            with contextlib.suppress(ValueError):  # absent, or a date: the backoff alone then
                wait = max(wait, min(float(retry_after or ""), 30.0))
            await asyncio.sleep(wait)
        if response.status in self.RETRY:
            response.release()
            raise BackendUnavailable(f"the upstream {self.base_url} is busy (HTTP {response.status} after "
                                     f"{self.retries} retries)")
        return response

    async def _read(self, response: aiohttp.ClientResponse) -> Body:
        """A whole answer: the upstream's error as the gateway's (4xx: the request's fault, else a 502)."""
        try:
            with self._reaching():
                raw = await response.read()
        finally:
            response.release()
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = None
        if response.status >= 400:
            detail = data.get("error") if isinstance(data, dict) else None
            message = detail.get("message") if isinstance(detail, dict) else detail
            text = self._redact(str(message or raw[:300].decode(errors="replace")).strip())
            if 400 <= response.status < 500 and response.status not in (401, 403):  # 401/403: our key
                raise BackendError(f"upstream: {text}", status=response.status, type="invalid_request_error")
            raise BackendError(f"the upstream {self.base_url} failed (HTTP {response.status}): {text}")
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise BackendError(f"the upstream {self.base_url} gave a response that is not an OpenAI one")
        return data

    def _redact(self, text: str) -> str:
        return redact(text, self._headers.get("Authorization", "")[7:])

    async def _post(self, path: str, body: Body) -> Body:
        return await self._read(await self._open(path, body))

    async def stream(self, kind: str, body: Body) -> AsyncIterator[Body]:
        """The upstream's own stream, chunk by chunk as it comes, its usage asked for in a last chunk
        (`stream_options.include_usage`). A failure before the first chunk is raised as for a whole
        answer; a failure after it (an `error` event, a broken connection) ends the iteration with a
        BackendError. An upstream that answers whole (JSON, not events) gives its answer as chunks.
        Closed early, the connection is dropped, so that the upstream stops writing."""
        path = "/chat/completions" if kind == "chat" else "/completions"
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        response = await self._open(path, body)
        if response.status >= 400 or "event-stream" not in response.headers.get("content-type", ""):
            for chunk in whole_as_chunks(await self._read(response), kind):
                yield chunk
            return
        finished = False
        try:
            with self._reaching():
                async for data in sse_data(response.content.iter_any()):
                    if data.strip() == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise BackendError(f"the upstream {self.base_url} streamed an event that is not "
                                           "JSON") from None
                    if not isinstance(chunk, dict):
                        raise BackendError(f"the upstream {self.base_url} streamed an event that is not an "
                                           "OpenAI chunk")
                    if chunk.get("error") is not None:
                        error = chunk["error"]
                        message = error.get("message") if isinstance(error, dict) else error
                        raise BackendError(f"the upstream {self.base_url} failed mid-stream: "
                                           f"{self._redact(str(message))[:300]}")
                    yield chunk
            finished = True
        except StreamFormatError as e:
            raise BackendError(f"the upstream {self.base_url} streamed no server-sent events: {e}") from None
        finally:
            if finished:
                response.release()
            else:
                response.close()

    async def chat(self, body: Body) -> Body:
        return await self._post("/chat/completions", body)

    async def complete(self, body: Body) -> Body:
        return await self._post("/completions", body)
