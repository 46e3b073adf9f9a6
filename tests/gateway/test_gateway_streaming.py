# ruff: noqa: F811 - the fixtures imported from test_gateway are the tests' arguments
"""The gateway's streamed answers, tools and stated limits: a slow OpenAI-compatible upstream that writes
a word at a time shows the first chunk reaching the client long before the last; the budget is settled
when a stream ends, when its client leaves, when its upstream fails and when it runs out of time; tools
reach backends that take them and are refused (400, naming them) by those that would drop them; the
refusals say the limit they met."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from test_gateway import PRICE, FakeBackend, _client, _rows, backend, gw  # noqa: F401

from openrebench.gateway import Budget, Gateway, InspectBackend, OpenAICompatibleBackend, RoleModel
from openrebench.gateway._likelihood import Likelihood, LocalModelBackend
from openrebench.gateway._streaming import StreamFormatError, sse_data

WORDS = ["one", " two", " three", " four", " five", " six"]
TOOL = {"type": "function", "function": {"name": "add", "description": "adds", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


class SlowUpstream:
    """An OpenAI-compatible server that writes its answer a word every `delay_s` when asked to stream
    (with its usage last only when `stream_options.include_usage` asks, as OpenAI does), or whole. With
    tools it calls `add` instead, its arguments in pieces. `fail_after`: words before an error event;
    `stall_after`: words before it stops writing. `aborted` is set when the gateway hangs up on it."""

    def __init__(self, delay_s: float = 0.1, fail_after: int | None = None,
                 stall_after: int | None = None) -> None:
        self.delay_s, self.fail_after, self.stall_after = delay_s, fail_after, stall_after
        self.bodies: list[dict[str, Any]] = []
        self.aborted = threading.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.complete)
        return app

    @staticmethod
    def _usage(words: int) -> dict[str, int]:
        return {"prompt_tokens": 7, "completion_tokens": words, "total_tokens": 7 + words}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        calls = [{"index": 0, "id": "call_1", "type": "function",
                  "function": {"name": "add", "arguments": ""}},
                 {"index": 0, "function": {"arguments": '{"a": '}},
                 {"index": 0, "function": {"arguments": "1}"}}]
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(WORDS)}
            if body.get("tools"):
                call = {"id": "call_1", "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1}'}}
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "up",
                                      "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                      "usage": self._usage(len(WORDS))})
        deltas = ([{"tool_calls": [c]} for c in calls] if body.get("tools")
                  else [{"role": "assistant", "content": w} if i == 0 else {"content": w}
                        for i, w in enumerate(WORDS)])
        head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}
        return await self._stream(request, body, [
            {**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas],
            {**head, "choices": [{"index": 0, "delta": {},
                                  "finish_reason": "tool_calls" if body.get("tools") else "stop"}]}, head)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        head = {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "up"}
        chunks = [{**head, "choices": [{"index": 0, "text": w, "logprobs": None, "finish_reason": None}]}
                  for w in WORDS]
        return await self._stream(request, body, chunks, {**head, "choices": [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}, head)

    async def _stream(self, request: web.Request, body: dict[str, Any], chunks: list[dict[str, Any]],
                      last: dict[str, Any], head: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i, chunk in enumerate(chunks):
                if i:
                    await asyncio.sleep(self.delay_s)
                if i == self.fail_after:
                    await response.write(_sse({"error": {"message": "the model fell over"}}))
                    return response
                if i == self.stall_after:  # until the gateway hangs up
                    while request.transport is not None and not request.transport.is_closing():
                        await asyncio.sleep(0.02)
                    raise ConnectionResetError("hung up on")
                await response.write(_sse(chunk))
            await response.write(_sse(last))
            if (body.get("stream_options") or {}).get("include_usage"):
                await response.write(_sse({**head, "choices": [], "usage": self._usage(len(chunks))}))
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            self.aborted.set()
            raise
        return response


@contextlib.contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """`app` on 127.0.0.1 from a thread with its own event loop: its base URL (…/v1)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SlowUpstream, OpenAICompatibleBackend]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    fake = SlowUpstream()
    with serving(fake.app()) as url:
        yield fake, OpenAICompatibleBackend(url, "upstream-name", backoff_s=0.001)


def _granted(gw: Gateway, tmp_path: Path, backend: Any, **kw: Any) -> Any:
    return gw.grant(roles={"task_model": RoleModel(backend, "fake/model", price=PRICE)},
                    usage_path=tmp_path / "run" / "usage.jsonl", **kw)


def _wait_rows(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(rows := _rows(path)) >= count:
            return rows
        time.sleep(0.02)
    return _rows(path) if path.exists() else []


def _settled(grant: Any, timeout_s: float = 5.0) -> bool:
    """Whether the grant's requests hold nothing of its budget any more (a hold is released just after
    its row is written, and a client may see its answer end in between)."""
    deadline = time.monotonic() + timeout_s
    while grant.usage.held(grant.run_id) != (0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(grant.usage.held(grant.run_id) == (0, 0.0))


def _post(token: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data



def test_upstream_events_are_read_however_their_bytes_are_split_and_one_past_the_limit_is_refused() -> None:
    stream = (b": a comment\r\nevent: x\r\ndata: {\"a\": 1}\r\n\r\ndata: line one\ndata: line two\n\n"
              b"id: 7\nretry: 10\n\ndata:[DONE]")  # CRLF, two data lines, fields, no last newline

    async def read(pieces: list[bytes], limit: int = 1 << 20) -> list[str]:
        async def source() -> Any:
            for p in pieces:
                yield p
        return [d async for d in sse_data(source(), limit)]

    expected = ['{"a": 1}', "line one\nline two", "[DONE]"]
    assert asyncio.run(read([stream])) == expected
    assert asyncio.run(read([stream[i:i + 1] for i in range(len(stream))])) == expected  # a byte at a time
    with pytest.raises(StreamFormatError, match="longer than 100 bytes"):
        asyncio.run(read([b"data: " + b"x" * 60, b"y" * 60 + b"\n\n"], limit=100))
    with pytest.raises(StreamFormatError):  # many short data lines of one event count together
        asyncio.run(read([b"data: xxxxxxxxxx\n"] * 20, limit=100))

# -- streaming ------------------------------------------------------------------------------------------

@pytest.mark.timing  # the first chunk's time against the last's: alone, not among busy workers
def test_a_stream_reaches_the_client_as_the_upstream_writes_it_and_is_metered_when_it_ends(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    grant = _granted(gw, tmp_path, backend, budget=Budget(tokens=100_000))
    client = _client(gw, grant.token)
    start = time.perf_counter()
    stream = client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "go"}],
                                            stream=True, stream_options={"include_usage": True},
                                            max_tokens=50)
    arrivals, text, usage = [], "", None
    for chunk in stream:
        arrivals.append(time.perf_counter() - start)
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
        assert chunk.model == "fake/model"
    total = arrivals[-1]
    print(f"chat stream: first chunk after {arrivals[0]:.3f} s, last after {total:.3f} s")
    assert text == "".join(WORDS)
    assert total >= (len(WORDS) - 1) * fake.delay_s and arrivals[0] < total / 3  # not held back to the end
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (7, len(WORDS))
    sent = fake.bodies[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "upstream-name" and sent["max_tokens"] == 50
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert (row["status"], row["prompt_tokens"], row["completion_tokens"], row["endpoint"]) == (
        200, 7, len(WORDS), "chat")
    assert _settled(grant)  # the reservation is settled
    assert grant.totals().tokens == 7 + len(WORDS)

    start = time.perf_counter()  # text completions too, and without usage asked: none sent, still charged
    parts = [(time.perf_counter() - start, c) for c in client.completions.create(
        model="task_model", prompt="count", stream=True, max_tokens=50)]
    assert "".join(c.choices[0].text for _, c in parts) == "".join(WORDS)
    assert parts[0][0] < parts[-1][0] / 3 and all(c.usage is None for _, c in parts)
    assert _rows(tmp_path / "run" / "usage.jsonl")[-1]["completion_tokens"] == len(WORDS)


def test_a_client_that_leaves_mid_stream_is_charged_what_was_streamed_and_the_upstream_is_hung_up_on(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    fake.delay_s = 0.2
    grant = _granted(gw, tmp_path, backend, budget=Budget(tokens=100_000))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(gw.socket_path))
    conn.sendall(_post(grant.token, {"model": "task_model", "stream": True, "max_tokens": 40,
                                     "messages": [{"role": "user", "content": "go"}]}))
    received = b""
    while b'"one"' not in received:
        received += conn.recv(4096)
    assert received.startswith(b"HTTP/1.1 200") and b"text/event-stream" in received
    conn.close()  # gone after the first word
    (row,) = _wait_rows(tmp_path / "run" / "usage.jsonl", 1)
    assert row["status"] == 499 and "left mid-stream" in row["error"]
    assert row["prompt_tokens"] > 0 and 3 <= row["completion_tokens"] <= 40  # "one" at least, the cap at most
    assert fake.aborted.wait(5)  # the upstream was hung up on, not read to its end
    assert _settled(grant)
    assert grant.totals().tokens == row["prompt_tokens"] + row["completion_tokens"]


def test_an_upstream_failing_mid_stream_ends_it_with_an_error_event_and_a_backend_failure_row(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    fake.delay_s, fake.fail_after = 0.01, 2
    grant = _granted(gw, tmp_path, backend)
    seen = []
    with pytest.raises(openai.APIError, match="fell over"):
        for chunk in _client(gw, grant.token).chat.completions.create(
                model="task_model", stream=True, messages=[{"role": "user", "content": "go"}]):
            seen.append(chunk.choices[0].delta.content)
    assert seen == WORDS[:2]
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert row["status"] == 502 and "mid-stream" in row["error"] and row["completion_tokens"] > 0
    assert _settled(grant)


def test_a_stream_past_the_gateways_timeout_ends_with_an_error_event_and_is_charged_what_it_held(
        tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    fake.delay_s, fake.stall_after = 0.01, 2
    gateway = Gateway(tmp_path / "gw.sock", request_timeout_s=0.5)
    with gateway.start_in_thread():
        grant = _granted(gateway, tmp_path, backend, budget=Budget(tokens=100_000))
        seen = []
        with pytest.raises(openai.APIError, match=r"longer than 0\.5 s"):
            for chunk in _client(gateway, grant.token).chat.completions.create(
                    model="task_model", stream=True, max_tokens=300,
                    messages=[{"role": "user", "content": "x"}]):
                seen.append(chunk.choices[0].delta.content)
        assert seen == WORDS[:2]
        (row,) = _rows(tmp_path / "run" / "usage.jsonl")
        assert row["status"] == 504 and row["completion_tokens"] == 300  # the provider may have spent it
        assert _settled(grant)
        assert fake.aborted.wait(5)


def test_a_backend_that_cannot_stream_answers_whole_as_one_event(gw: Gateway, tmp_path: Path,
                                                                  backend: FakeBackend) -> None:
    grant = _granted(gw, tmp_path, backend)
    chunks = list(_client(gw, grant.token).chat.completions.create(
        model="task_model", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "whole"}]))
    assert [c.choices[0].delta.content for c in chunks if c.choices] == ["echo: whole"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 15
    assert _settled(grant)




class Flood(FakeBackend):
    """Streams 64 KiB events as fast as they are taken (100 of them); `closed` once it is let go."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = threading.Event()

    async def stream(self, kind: str, body: dict[str, Any]) -> Any:
        try:
            for _ in range(100):
                yield {"id": "f", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": "w" * 65536}, "finish_reason": None}]}
        finally:
            self.closed.set()


def test_a_client_that_stops_reading_its_stream_is_dropped_and_its_place_at_the_backend_freed(
        gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream holds one of the backend's places (one of llama.cpp's 4 slots): a client that stops
    reading would keep it from every other run until the time limit."""
    from openrebench.gateway import _stream_out

    monkeypatch.setattr(_stream_out, "STREAM_WRITE_TIMEOUT_S", 0.5)
    flood = Flood()
    grant = _granted(gw, tmp_path, flood, budget=Budget(usd=1000.0))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect(str(gw.socket_path))
    try:
        conn.sendall(_post(grant.token, {"model": "task_model", "stream": True, "max_tokens": 10_000_000,
                                         "messages": [{"role": "user", "content": "go"}]}))
        (row,) = _wait_rows(tmp_path / "run" / "usage.jsonl", 1)  # never read: dropped
    finally:
        conn.close()
    assert row["status"] == 499 and "left mid-stream" in row["error"]
    assert flood.closed.wait(5) and _settled(grant)
    deadline = time.monotonic() + 5
    while gw._queue(flood).active and time.monotonic() < deadline:  # given back as the handler returns
        time.sleep(0.01)
    assert gw._queue(flood).active == 0

@pytest.mark.timing  # the first chunk's time against the last's: alone, not among busy workers
def test_an_inspect_provider_that_streams_is_streamed_through_and_its_usage_charged(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    """Inspect's OpenAI-compatible provider (as OpenAI's, Anthropic's, Google's) streams when asked for
    `on_stream`: its text reaches the client as the upstream writes it, its usage comes at the end."""
    fake, backend = upstream
    inspect = InspectBackend("openai-api/fake/upstream-name", base_url=backend.base_url, api_key="k")
    grant = _granted(gw, tmp_path, inspect, budget=Budget(tokens=100_000))
    client = _client(gw, grant.token)
    hi = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="task_model", messages=hi).choices[0].message.content == (
        "".join(WORDS))  # the provider made (a second's imports), and whole answers still whole
    start = time.perf_counter()
    arrivals, text, usage = [], "", None
    for chunk in client.chat.completions.create(
            model="task_model", messages=[{"role": "user", "content": "go"}], stream=True,
            stream_options={"include_usage": True}):
        arrivals.append(time.perf_counter() - start)
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    print(f"inspect stream: first chunk after {arrivals[0]:.3f} s, last after {arrivals[-1]:.3f} s")
    assert text == "".join(WORDS) and fake.bodies[-1]["stream"] is True
    assert arrivals[0] < arrivals[-1] / 3 and len(arrivals) >= len(WORDS)
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (7, len(WORDS))
    assert _rows(tmp_path / "run" / "usage.jsonl")[-1]["status"] == 200
    assert _settled(grant)

# -- tools ----------------------------------------------------------------------------------------------

def test_tools_reach_an_upstream_that_takes_them_and_its_calls_come_back_whole_and_streamed(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    fake.delay_s = 0.01
    client = _client(gw, _granted(gw, tmp_path, backend).token)
    ask: dict[str, Any] = {"model": "task_model", "tools": [TOOL], "tool_choice": "auto",
                           "messages": [{"role": "user", "content": "add"}]}
    whole = client.chat.completions.create(**ask)
    call = whole.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1})  # type: ignore[union-attr]
    assert fake.bodies[-1]["tools"] == [TOOL] and fake.bodies[-1]["tool_choice"] == "auto"
    pieces = [c.choices[0].delta.tool_calls for c in client.chat.completions.create(**ask, stream=True)
              if c.choices and c.choices[0].delta.tool_calls]
    assert "".join(p[0].function.arguments or "" for p in pieces) == '{"a": 1}'  # type: ignore[union-attr]
    assert pieces[0][0].function.name == "add" and pieces[0][0].id == "call_1"  # type: ignore[union-attr]


def _local(upstream: OpenAICompatibleBackend) -> LocalModelBackend:
    """The offline model's backend, over the fake upstream: its checks are the backend's own."""
    upstream.capacity, upstream.usage_counts_one_choice = 4, True
    return LocalModelBackend(upstream, Likelihood())


def test_the_offline_model_refuses_tools_and_what_llama_cpp_would_drop_naming_them(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    client = _client(gw, _granted(gw, tmp_path, _local(backend)).token)
    hi = [{"role": "user", "content": "hi"}]
    for extra, words in (({"tools": [TOOL]}, "does not take tools: its chat template has no tool format"),
                         ({"tool_choice": "required"}, "does not take tool_choice"),
                         ({"reasoning_effort": "high"}, "reasoning_effort: it is not a reasoning model"),
                         ({"n": 5}, "'n' is 5: fake/model (its server's slots) takes at most 4 choices"),
                         ({"messages": [*hi, {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                             {"role": "tool", "tool_call_id": "c", "content": "1"}]},
                          "tool calls in messages")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="task_model", **{"messages": hi, **extra})  # type: ignore[call-overload]
        assert words in e.value.message, e.value.message
    with pytest.raises(openai.BadRequestError, match="does not take tools"):
        client.responses.create(model="task_model", input="hi", tools=[{  # type: ignore[list-item]
            "type": "function", "name": "add", "parameters": TOOL["function"]["parameters"]}])
    assert fake.bodies == []  # nothing reached the model
    out = client.chat.completions.create(model="task_model", messages=hi, n=2, tool_choice="none")
    assert out.choices[0].message.content == "".join(WORDS)
    assert {r["status"] for r in _rows(tmp_path / "run" / "usage.jsonl")} == {400, 200}


def test_inspect_backends_refuse_parameters_they_would_drop_and_map_the_ones_inspect_takes(
        gw: Gateway, tmp_path: Path) -> None:
    seen: list[Any] = []

    def outputs(messages: list[Any], tools: list[Any], tool_choice: Any, config: Any) -> Any:
        from inspect_ai.model import ModelOutput

        seen.append(config)
        return ModelOutput.from_content("mockllm/model", '{"ok": true}')

    mock = InspectBackend("mockllm/model", custom_outputs=outputs)
    client = _client(gw, gw.grant(roles={"task_model": RoleModel(mock, "mockllm/model")},
                                  usage_path=tmp_path / "usage.jsonl").token)
    hi = [{"role": "user", "content": "hi"}]
    for extra in ({"mirostat": 2}, {"prediction": {"type": "content", "content": "x"}},
                  {"response_format": {"type": "json_object"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="task_model", messages=hi, extra_body=extra)  # type: ignore[arg-type]
        assert next(iter(extra)) in e.value.message or "json_schema" in e.value.message, e.value.message
    assert seen == []
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    client.chat.completions.create(
        model="task_model", messages=hi, reasoning_effort="low", parallel_tool_calls=False,
        logit_bias={"7": -5},
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
        user="someone", extra_body={"top_k": 3, "verbosity": "low"})  # type: ignore[arg-type]
    config = seen[-1]
    assert (config.reasoning_effort, config.parallel_tool_calls, config.logit_bias, config.top_k,
            config.verbosity, config.response_schema.name) == ("low", False, {7: -5.0}, 3, "low", "verdict")


# -- limits, stated -------------------------------------------------------------------------------------

def test_refusals_state_the_limit_they_met(gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    client = _client(gw, _granted(gw, tmp_path, backend, budget=Budget(tokens=200)).token)
    hi = [{"role": "user", "content": "hi"}]
    for extra, words in (({"n": 17}, "'n' is 17: the gateway takes at most 16 choices a request"),
                         ({"max_tokens": -3}, "'max_tokens' must be a positive integer, not -3"),
                         ({"max_completion_tokens": "lots"}, "must be a positive integer, not \"lots\"")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="task_model", messages=hi, extra_body=extra)  # type: ignore[arg-type]
        assert words in e.value.message, e.value.message
    with pytest.raises(openai.BadRequestError,
                       match=r"'n' is 3 for each of 6 prompts \(18 choices\): the gateway takes at most 16"):
        client.completions.create(model="task_model", prompt=["p"] * 6, n=3)
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "x" * 300}])
    assert "falls" in e.value.message and "token(s) short" in e.value.message
    assert backend.bodies == []


class _Failing:
    """An upstream that fails every call with `error`, and says it is `well` when asked."""

    name, capacity, usage_counts_one_choice = "stub", 4, True

    def __init__(self, error: Exception, well: bool) -> None:
        self.error, self.well = error, well

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        raise self.error

    complete = chat

    async def stream(self, kind: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        raise self.error
        yield {}  # an async generator, as the real upstreams' streams are

    async def healthy(self) -> bool:
        return self.well


def test_a_500_of_a_healthy_offline_server_is_the_requests_fault_and_anything_else_stays_as_it_came() -> None:
    """llama.cpp answers requests that are the client's fault with a 500 quoting them: while the server
    answers its health check, that is a 400 to the caller (no infrastructure failure a scoring's code
    could choose); a server that is down, one that cannot be reached and the caller's own 4xx stay."""
    from openrebench.gateway._backends import BackendError, BackendUnavailable, BadRequest

    quoted = BackendError("the upstream http://127.0.0.1:1/v1 failed (HTTP 500): Unknown reasoning format: x")

    async def outcome(error: Exception, well: bool, call: str) -> Exception:
        local = LocalModelBackend(_Failing(error, well), Likelihood())  # type: ignore[arg-type]
        try:
            if call == "stream":
                async for _ in local.stream("chat", {}):
                    pass
            else:
                await getattr(local, call)({"prompt": "hi"} if call == "complete" else {})
        except Exception as raised:
            return raised
        raise AssertionError("no error")

    for call in ("chat", "complete", "stream"):
        got = asyncio.run(outcome(quoted, True, call))
        assert isinstance(got, BadRequest) and got.status == 400, (call, got)
        assert "Unknown reasoning format: x" in got.message  # the caller sees why, as before
        assert asyncio.run(outcome(quoted, False, call)) is quoted  # a sick server: the harness's failure
    down = BackendUnavailable("the upstream cannot be reached")
    refused = BadRequest("bad")
    assert asyncio.run(outcome(down, True, "chat")) is down
    assert asyncio.run(outcome(refused, True, "chat")) is refused

    async def nothing_there() -> bool:
        upstream = OpenAICompatibleBackend("http://127.0.0.1:9/v1", "x")
        try:
            return await upstream.healthy()
        finally:
            await upstream.aclose()

    assert asyncio.run(nothing_there()) is False
