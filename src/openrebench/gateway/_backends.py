"""Where the gateway's requests go: a provider through Inspect, or an OpenAI-compatible server.

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
import time
import uuid
from typing import Any, Protocol, runtime_checkable

import aiohttp

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
class Backend(Protocol):
    """A model behind the gateway. `chat` answers a `chat.completion`, `complete` a `text_completion`."""

    async def chat(self, body: Body) -> Body: ...

    async def complete(self, body: Body) -> Body: ...


# Inspect's stop reasons as OpenAI's finish reasons.
FINISH = {"stop": "stop", "max_tokens": "length", "model_length": "length", "tool_calls": "tool_calls",
          "content_filter": "content_filter"}


def _text(content: Any) -> str:
    """The text of an OpenAI message content: a string or a list of parts, of which only text is taken."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise Unsupported("only text content parts are supported through this backend")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest("message content must be a string or a list of text parts")


class InspectBackend:
    """Any model Inspect can make (`openai/gpt-4o`, `anthropic/...`, `hf/...`, `mockllm/model`).

    The model is made on first use, in the event loop that serves the gateway (a provider's client is
    bound to its loop), and not memoized, so two gateways never share one.
    """

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 **model_args: Any) -> None:
        self.name = model
        self._spec = (base_url, api_key, model_args)
        self._model: Any = None

    def _get(self) -> Any:
        if self._model is None:
            from inspect_ai.model import get_model

            base_url, api_key, model_args = self._spec
            self._model = get_model(self.name, base_url=base_url, api_key=api_key, memoize=False,
                                    **model_args)
        return self._model

    def _messages(self, body: Body) -> list[Any]:
        from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser
        from inspect_ai.tool import ToolCall

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        out: list[Any] = []
        for m in messages:
            if not isinstance(m, dict):
                raise BadRequest("each message must be an object")
            role, text = m.get("role"), _text(m.get("content"))
            if role in ("system", "developer"):
                out.append(ChatMessageSystem(content=text))
            elif role == "user":
                out.append(ChatMessageUser(content=text))
            elif role == "assistant":
                calls = []
                for c in m.get("tool_calls") or []:
                    fn = c.get("function") if isinstance(c, dict) else None
                    if not isinstance(fn, dict):
                        raise BadRequest("each tool call must be {'id': ..., 'function': {...}}")
                    args = fn.get("arguments") or {}
                    if isinstance(args, str):
                        try:
                            args = json.loads(args)
                        except ValueError:
                            args = {}
                    calls.append(ToolCall(id=str(c.get("id", "")), function=str(fn.get("name", "")),
                                          arguments=args if isinstance(args, dict) else {}))
                out.append(ChatMessageAssistant(content=text, tool_calls=calls or None))
            elif role == "tool":
                out.append(ChatMessageTool(content=text, tool_call_id=m.get("tool_call_id")))
            else:
                raise BadRequest(f"unknown message role {role!r} (system, developer, user, assistant, tool)")
        return out

    @staticmethod
    def _config(body: Body) -> Any:
        from inspect_ai.model import GenerateConfig

        stop = body.get("stop")
        top = body.get("top_logprobs")
        fields = {
            "num_choices": body.get("n"), "temperature": body.get("temperature"),
            "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
            "stop_seqs": [stop] if isinstance(stop, str) else stop, "top_p": body.get("top_p"),
            "seed": body.get("seed"), "frequency_penalty": body.get("frequency_penalty"),
            "presence_penalty": body.get("presence_penalty"),
            "logprobs": bool(body.get("logprobs")) or None, "top_logprobs": top or None,
        }
        try:
            return GenerateConfig(**{k: v for k, v in fields.items() if v is not None})
        except ValueError as e:
            raise BadRequest(f"invalid generation settings: {str(e).splitlines()[0]}") from None

    @staticmethod
    def _tools(body: Body) -> tuple[list[Any], Any]:
        from inspect_ai.tool import ToolFunction, ToolInfo, ToolParams

        tools = []
        for t in body.get("tools") or []:
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest("each tool must be {'type': 'function', 'function': {'name': ...}}")
            try:
                params = ToolParams.model_validate(fn.get("parameters") or {})
            except ValueError as e:
                raise BadRequest(f"tool {fn['name']}: invalid parameters "
                                 f"({str(e).splitlines()[0]})") from None
            tools.append(ToolInfo(name=fn["name"], description=fn.get("description") or "",
                                  parameters=params))
        choice = body.get("tool_choice") or "auto"
        if isinstance(choice, dict):
            choice = ToolFunction(name=str((choice.get("function") or {}).get("name", "")))
        elif choice == "required":
            choice = "any"
        elif choice not in ("auto", "none"):
            raise BadRequest(f"unknown tool_choice {choice!r}")
        return tools, choice

    async def chat(self, body: Body) -> Body:
        messages, config = self._messages(body), self._config(body)
        tools, choice = self._tools(body)
        model = self._get()
        try:
            output = await model.generate(messages, tools=tools, tool_choice=choice if tools else None,
                                          config=config)
        except ConnectionError as e:
            raise BackendUnavailable(f"the model {self.name} cannot be reached ({type(e).__name__})") from e
        except BackendError:
            raise
        except Exception as e:
            detail = redact(str(e).splitlines()[0] if str(e) else "", self._spec[1])[:300]
            raise BackendError(f"the model {self.name} failed: {type(e).__name__}: {detail}") from e
        if output.error:
            raise BackendError(f"the model {self.name} failed: {redact(output.error, self._spec[1])[:300]}")
        choices = []
        for i, c in enumerate(output.choices):
            message: Body = {"role": "assistant", "content": c.message.text}
            if c.message.tool_calls:
                message["tool_calls"] = [
                    {"id": t.id, "type": "function",
                     "function": {"name": t.function, "arguments": json.dumps(t.arguments)}}
                    for t in c.message.tool_calls]
            logprobs = None if c.logprobs is None else {
                "content": [lp.model_dump(exclude_none=True) for lp in c.logprobs.content]}
            choices.append({"index": i, "message": message, "logprobs": logprobs,
                            "finish_reason": FINISH.get(c.stop_reason, "stop")})
        answer: Body = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                        "created": int(time.time()), "model": self.name, "choices": choices}
        usage = output.usage
        if usage is not None:  # none: the gateway estimates it, rather than charge nothing
            prompt = usage.input_tokens + (usage.input_tokens_cache_read or 0) + (
                usage.input_tokens_cache_write or 0)
            completion = usage.output_tokens
            answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion}
        return answer

    async def complete(self, body: Body) -> Body:
        raise Unsupported(f"the model {self.name} has no text completions endpoint through Inspect "
                          "(use /v1/chat/completions)")


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

    async def _send(self, url: str, body: Body) -> tuple[int, bytes, str | None]:
        try:
            async with self._session().post(url, json=body) as response:
                return response.status, await response.read(), response.headers.get("retry-after")
        except TimeoutError as e:
            raise BackendUnavailable(f"the upstream {self.base_url} timed out", status=504,
                                     type="timeout") from e
        except aiohttp.ClientError as e:
            raise BackendUnavailable(f"the upstream {self.base_url} cannot be reached "
                                     f"({type(e).__name__})") from e

    async def _post(self, path: str, body: Body) -> Body:
        url = f"{self.base_url}{path}"
        body = {**body, "model": self.name}
        for attempt in range(self.retries + 1):
            status, raw, retry_after = await self._send(url, body)
            if status not in self.RETRY or attempt == self.retries:
                break
            wait = self.backoff_s * 2 ** attempt
            with contextlib.suppress(ValueError):  # absent, or a date: the backoff alone then
                wait = max(wait, min(float(retry_after or ""), 30.0))
            await asyncio.sleep(wait)
        if status in self.RETRY:
            raise BackendUnavailable(f"the upstream {self.base_url} is busy (HTTP {status} after "
                                     f"{self.retries} retries)")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = None
        if status >= 400:
            detail = data.get("error") if isinstance(data, dict) else None
            message = detail.get("message") if isinstance(detail, dict) else detail
            text = redact(str(message or raw[:300].decode(errors="replace")).strip(),
                          self._headers.get("Authorization", "")[7:])
            if 400 <= status < 500 and status not in (401, 403):  # 401/403: the harness's key is wrong
                raise BackendError(f"upstream: {text}", status=status, type="invalid_request_error")
            raise BackendError(f"the upstream {self.base_url} failed (HTTP {status}): {text}")
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise BackendError(f"the upstream {self.base_url} gave a response that is not an OpenAI one")
        return data

    async def chat(self, body: Body) -> Body:
        return await self._post("/chat/completions", body)

    async def complete(self, body: Body) -> Body:
        return await self._post("/completions", body)
