# ruff: noqa: F811 - the fixtures imported above are the tests' arguments
"""Attacks on the model gateway by the agent inside the sandbox, holding its run's token in OPENAI_API_KEY
and the forwarder's address in OPENAI_BASE_URL: spending past the budget without being charged, models
and grants it was not given, the harness's keys, the usage log, the gateway's memory and connections,
and the local model server. Each test asserts the defended behaviour: a failing one means the attack
works. Most use the gateway with fake backends (fast); the sandbox ones the toy `judge` environment of
tests/gateway/test_gateway_sandbox.py in a real bwrap sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from test_gateway import PRICE, FakeBackend, Hangs, _aclient, _client, _grant, _rows, backend, gw  # noqa: F401
from test_gateway_sandbox import installed, needs_bwrap, open_box, secrets_in_harness  # noqa: F401

from openrebench.gateway import Budget, Gateway, InspectBackend, RoleModel
from openrebench.gateway._server import MAX_CHOICES

attack = pytest.mark.attack


class Generates(FakeBackend):
    """An upstream that writes as much as it is let: `max_tokens` (or `max_completion_tokens`) tokens a
    choice, else 100,000, reported in its usage (or no usage at all, with `usage=False`)."""

    def __init__(self, delay_s: float = 0.05, usage: bool = True) -> None:
        super().__init__(delay_s)
        self.usage = usage

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(dict(body))
        await asyncio.sleep(self.delay_s)
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or 100_000
        n = body.get("n") or 1
        out: dict[str, Any] = {
            "id": "x", "object": "chat.completion", "created": 0, "model": "upstream",
            "choices": [{"index": i, "message": {"role": "assistant", "content": "word " * min(cap, 2000)},
                         "finish_reason": "length"} for i in range(n)]}
        if self.usage:
            out["usage"] = {"prompt_tokens": 10, "completion_tokens": cap * n, "total_tokens": 10 + cap * n}
        return out


def _flood(gw: Gateway, token: str, requests: int, **kw: Any) -> list[int]:
    async def one(client: openai.AsyncOpenAI) -> int:
        try:
            await client.chat.completions.create(model="task_model",
                                                 messages=[{"role": "user", "content": "go"}], **kw)
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    async def main() -> list[int]:
        async with _aclient(gw, token) as client:
            return list(await asyncio.gather(*(one(client) for _ in range(requests))))

    return asyncio.run(main())


def _raw(path: Path, data: bytes) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.sendall(data)
    return s


def _post(token: str, body: dict[str, Any] | bytes, length: int | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length or len(data)}\r\n\r\n")
    return head.encode() + data


def _wait_rows(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(rows := _rows(path)) >= count:
            return rows
        time.sleep(0.05)
    return _rows(path) if path.exists() else []


# -- spending past the budget ------------------------------------------------------------------------------

@attack(env="gateway", cls="budget overshoot", invariant=6)
def test_sixteen_concurrent_requests_with_a_huge_max_tokens_stay_within_the_token_budget(
        gw: Gateway, tmp_path: Path) -> None:
    """Huge max_tokens on 16 requests at once: each passes the budget check before any is charged."""
    backend = Generates()
    token = _grant(gw, tmp_path, backend, budget=Budget(tokens=1000))
    statuses = _flood(gw, token, 16, max_tokens=1_000_000)
    assert 200 in statuses and set(statuses) <= {200, 429}
    spent = gw._grants[next(iter(gw._grants))].totals().tokens
    assert spent <= 1000 + 16 * 10, spent  # the budget, overshot by prompts at most
    assert all((b.get("max_tokens") or 0) <= 1000 for b in backend.bodies)


@attack(env="gateway", cls="budget overshoot", invariant=6)
def test_requests_naming_no_max_tokens_stay_within_the_dollar_budget(gw: Gateway, tmp_path: Path) -> None:
    """No max_tokens at all near the end of a dollar budget: the model writes as long as it likes."""
    backend = Generates()
    token = _grant(gw, tmp_path, backend, budget=Budget(usd=0.5))  # 250 output tokens at $2000/M
    statuses = _flood(gw, token, 8)
    assert 200 in statuses
    cost = _rows(tmp_path / "run" / "usage.jsonl")
    assert sum(r["cost_usd"] for r in cost) <= 0.5 + 8 * 0.01, cost


@attack(env="gateway", cls="budget overshoot", invariant=6)
def test_many_choices_and_uncounted_length_parameters_are_refused_before_the_backend(
        gw: Gateway, tmp_path: Path) -> None:
    """n=10000, max_tokens as a string (coerced by Inspect), llama.cpp's n_predict, vLLM's best_of."""
    backend = Generates()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=100_000)))
    for extra in ({"n": 10_000}, {"n": MAX_CHOICES + 1}, {"max_tokens": "1000000"},
                  {"max_completion_tokens": 1.5e9}, {"n_predict": 1_000_000}, {"best_of": 50}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "x"}],
                                           extra_body=extra)
    with pytest.raises(openai.BadRequestError):  # a batch of prompts is one choice each
        client.completions.create(model="task_model", prompt=["p"] * (MAX_CHOICES + 1), max_tokens=10)
    assert backend.bodies == []
    out = client.chat.completions.create(model="task_model", n=4, max_tokens=100_000,
                                         messages=[{"role": "user", "content": "x"}])
    assert len(out.choices) == 4 and backend.bodies[-1]["max_tokens"] <= 100_000 // 4


class GeneratesText(Generates):
    """`Generates` on the completions endpoint too: each prompt of a batch gets its choices."""

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(dict(body))
        cap = body.get("max_tokens") or 100_000
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        return {"id": "x", "object": "text_completion", "created": 0, "model": "upstream",
                "choices": [{"index": i, "text": "word " * min(cap, 2000), "logprobs": None,
                             "finish_reason": "length"} for i in range(len(prompts))],
                "usage": {"prompt_tokens": 10, "completion_tokens": cap * len(prompts),
                          "total_tokens": 10 + cap * len(prompts)}}


@attack(env="gateway", cls="reply past the tier's cap", invariant=6, defence="reply-cap")
def test_no_endpoint_gives_a_reply_longer_than_the_tiers_cap(gw: Gateway, tmp_path: Path) -> None:
    """A tier that cuts its model's replies (rust_codecontests' mini: 256 tokens) is asked for more every
    way a client can: a huge max_tokens, max_completion_tokens, none at all, a stream, the Responses
    API's max_output_tokens, a batch of text prompts. The cap is imposed where the gateway holds a
    request's worst case, which every endpoint passes through: no reply the backend is asked for, and
    none it is charged, is longer."""
    backend = GeneratesText(delay_s=0)
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(reply_tokens=256)))
    message = [{"role": "user", "content": "write a long program"}]
    for asked in ({"max_tokens": 1_000_000}, {"max_completion_tokens": 4096}, {}):
        client.chat.completions.create(model="task_model", messages=message, **asked)
    stream = client.chat.completions.create(model="task_model", messages=message, max_tokens=100_000,
                                            stream=True)
    list(stream)
    client.responses.create(model="task_model", input="write a long program", max_output_tokens=100_000)
    client.completions.create(model="task_model", prompt=["fn main() {"] * 3, max_tokens=100_000)
    asked_of_backend = [b.get("max_completion_tokens") or b.get("max_tokens") for b in backend.bodies]
    assert len(asked_of_backend) == 6 and all(cap == 256 for cap in asked_of_backend), asked_of_backend
    rows = _rows(tmp_path / "run" / "usage.jsonl")
    assert len(rows) == 6 and all(r["status"] == 200 for r in rows), rows
    assert [r["completion_tokens"] for r in rows] == [256] * 5 + [3 * 256]


@attack(env="gateway", cls="unmetered request", invariant=6)
def test_a_streamed_answer_is_charged_like_a_whole_one(gw: Gateway, tmp_path: Path,
                                                        backend: FakeBackend) -> None:
    """stream=True without stream_options: the client never sees usage; is it still charged?"""
    client = _client(gw, _grant(gw, tmp_path, backend))
    chunks = list(client.chat.completions.create(model="task_model", stream=True,
                                                 messages=[{"role": "user", "content": "s"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: s"
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (10, 5)


@attack(env="gateway", cls="unmetered request", invariant=6)
def test_an_answer_without_usage_is_charged_an_estimate_not_nothing(gw: Gateway, tmp_path: Path) -> None:
    """A backend (or an Inspect provider) that reports no usage: the tokens would be free."""
    client = _client(gw, _grant(gw, tmp_path, Generates(usage=False), budget=Budget(tokens=10**6)))
    client.chat.completions.create(model="task_model", max_tokens=2000,
                                   messages=[{"role": "user", "content": "q" * 4000}])
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert row["prompt_tokens"] >= 1000 and row["completion_tokens"] >= 2000, row


@attack(env="gateway", cls="unmetered request", invariant=6)
def test_inspect_output_without_usage_is_charged_an_estimate(gw: Gateway, tmp_path: Path) -> None:
    """An Inspect provider's output with usage None reached the log as zero tokens, silently."""
    from inspect_ai.model import ModelOutput

    long = ModelOutput.from_content("mockllm/model", "w" * 8000)
    assert long.usage is None
    backend = InspectBackend("mockllm/model", custom_outputs=[long])
    client = _client(gw, _grant(gw, tmp_path, backend, roles={"task_model": RoleModel(backend, "mockllm/x")}))
    client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "hi"}])
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert row["completion_tokens"] >= 2000, row


@attack(env="gateway", cls="unmetered request", invariant=6)
def test_a_client_that_hangs_up_mid_call_is_still_charged(gw: Gateway, tmp_path: Path) -> None:
    """Send the request, close the connection before the answer: the provider spent the tokens."""
    token = _grant(gw, tmp_path, FakeBackend(delay_s=0.3))
    _raw(gw.socket_path, _post(token, {"model": "task_model",  # type: ignore[arg-type]
                                       "messages": [{"role": "user", "content": "bye"}]})).close()
    (row,) = _wait_rows(tmp_path / "run" / "usage.jsonl", 1)
    assert row["status"] == 200 and row["completion_tokens"] == 5


@attack(env="gateway", cls="unmetered request", invariant=6)
def test_a_call_the_gateway_times_out_is_charged_what_it_held(tmp_path: Path) -> None:
    """A call running past the gateway's timeout was logged as 0 tokens, the provider's bill aside."""
    gateway = Gateway(tmp_path / "gw.sock", request_timeout_s=0.3)
    with gateway.start_in_thread():
        token = _grant(gateway, tmp_path, Hangs(), budget=Budget(tokens=100_000))
        with pytest.raises(openai.APIStatusError) as e:
            _client(gateway, token).chat.completions.create(
                model="task_model", max_tokens=500, messages=[{"role": "user", "content": "x"}])
        assert e.value.status_code == 504
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert row["completion_tokens"] == 500, row


@attack(env="gateway", cls="restart loses usage", invariant=6)
def test_a_call_in_flight_when_the_gateway_stops_is_logged_and_charged(tmp_path: Path) -> None:
    """Calls in flight when the gateway's thread stops (a restart) left no row: spent, never counted."""
    gateway = Gateway(tmp_path / "gw.sock", shutdown_timeout_s=0.2)
    thread = gateway.start_in_thread()
    token = _grant(gateway, tmp_path, Hangs(), budget=Budget(tokens=100_000))
    conn = _raw(gateway.socket_path, _post(token, {"model": "task_model", "max_tokens": 300,
                                                   "messages": [{"role": "user", "content": "x"}]}))
    time.sleep(0.3)
    thread.stop()
    conn.close()
    (row,) = _wait_rows(tmp_path / "run" / "usage.jsonl", 1)
    assert row["completion_tokens"] == 300 and row["status"] != 200, row


# -- prompts past the budget: the gateway reserves each request's worst case -----------------------------

class CountsBytes(FakeBackend):
    """An upstream whose tokenizer is at its worst for the gateway's bound: a token for each UTF-8 byte of
    the text (as byte-level BPE gives rare characters and random bytes), 4 a message for its template,
    tools as their JSON after a 346-token preamble (Anthropic's); it writes every token it is let
    (`max_tokens`, else 100,000 a choice), and a text completion with `echo` gives its prompts back."""

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(dict(body))
        await asyncio.sleep(self.delay_s)
        tools = body.get("tools")
        prompt = sum(4 + len(str(m.get("content") or "").encode()) for m in body["messages"]) + (
            346 + len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode()) if tools else 0)
        cap, n = body.get("max_completion_tokens") or body.get("max_tokens") or 100_000, body.get("n") or 1
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "upstream",
                "choices": [{"index": i, "message": {"role": "assistant", "content": "w " * min(cap, 1000)},
                             "finish_reason": "length"} for i in range(n)],
                "usage": _usage(prompt, cap * n)}

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(dict(body))
        await asyncio.sleep(self.delay_s)
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        prompt = sum(1 + len(p.encode()) for p in prompts)
        cap = 0 if body.get("max_tokens") == 0 else body.get("max_tokens") or 100_000
        n = (body.get("n") or 1) * len(prompts)
        return {"id": "x", "object": "text_completion", "created": 0, "model": "upstream",
                "choices": [{"index": i, "text": prompts[i % len(prompts)] if body.get("echo") else "w",
                             "logprobs": None, "finish_reason": "length"} for i in range(n)],
                "usage": _usage(prompt, cap * n)}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


PRICEY = {"input": 150.0, "output": 600.0}  # US$ per 1M tokens (o1-pro's list price)


def _rare(chars: int) -> str:
    """CJK characters (3 UTF-8 bytes each), spread over 20,000 of them: rare ones are 2 or 3 tokens each in
    byte-level BPE, where a character count or bytes / 4 takes them for one or less."""
    return "".join(chr(0x4E00 + i * 7919 % 20_000) for i in range(chars))


def _at_once(gw: Gateway, token: str, bodies: list[dict[str, Any]], endpoint: str = "chat") -> list[int]:
    """Send `bodies` all at once (the run's 16 slots), each `model="task_model"`: their statuses."""
    async def one(client: openai.AsyncOpenAI, body: dict[str, Any]) -> int:
        try:
            create = client.chat.completions.create if endpoint == "chat" else client.completions.create
            await create(model="task_model", **body)
            return 200
        except openai.APIStatusError as e:
            return e.status_code

    async def main() -> list[int]:
        async with _aclient(gw, token) as client:
            return list(await asyncio.gather(*(one(client, b) for b in bodies)))

    return asyncio.run(main())


def _status(call: Any) -> int:
    """The HTTP status of `call()`, an openai client's request."""
    try:
        call()
        return 200
    except openai.APIStatusError as e:
        return e.status_code


def _spent(gw: Gateway) -> tuple[int, float]:
    """Tokens and dollars the test's one grant has been charged."""
    (grant,) = gw._grants.values()
    return grant.totals().tokens, grant.totals().cost_usd


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_a_huge_prompt_with_max_tokens_1_is_refused_before_the_backend(gw: Gateway, tmp_path: Path) -> None:
    """A 27,000-token prompt with max_tokens 1 on a 10,000-token budget: only the completion was held."""
    backend = CountsBytes()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=10_000)))
    status = _status(lambda: client.chat.completions.create(
        model="task_model", max_tokens=1, messages=[{"role": "user", "content": _rare(9000)}]))
    assert _spent(gw)[0] <= 10_000, _spent(gw)
    assert status == 429 and backend.bodies == []


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_sixteen_concurrent_requests_each_just_under_the_remaining_budget_stay_within_it(
        gw: Gateway, tmp_path: Path) -> None:
    """16 requests at once, each a 6,000-token prompt that fits the 20,000-token budget alone: all checked
    against the same remainder before any is charged."""
    backend = CountsBytes()
    token = _grant(gw, tmp_path, backend, budget=Budget(tokens=20_000))
    ask = {"max_tokens": 100, "messages": [{"role": "user", "content": _rare(2000)}]}
    statuses = _at_once(gw, token, [ask] * 16)
    assert _spent(gw)[0] <= 20_000, _spent(gw)
    assert 200 in statuses and set(statuses) <= {200, 429}  # honest requests that fit are served


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_echo_requests_with_a_huge_prompt_and_max_tokens_0_are_charged_within_the_budget(
        gw: Gateway, tmp_path: Path) -> None:
    """echo=true, max_tokens 0 (a prompt's log-probabilities) on a batch of 8 long prompts: no completion
    is asked, so nothing at all was held."""
    backend = CountsBytes()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=10_000)))
    status = _status(lambda: client.completions.create(
        model="task_model", prompt=[_rare(1000)] * 8, echo=True, max_tokens=0, logprobs=0))
    assert _spent(gw)[0] <= 10_000, _spent(gw)
    assert status == 429
    out = client.completions.create(model="task_model", prompt=[_rare(100)], echo=True, max_tokens=0,
                                    logprobs=0)  # a short one fits
    assert out.choices[0].text == _rare(100) and _spent(gw)[0] <= 10_000


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_sixteen_choices_with_a_huge_max_tokens_after_a_long_prompt_stay_within_the_budget(
        gw: Gateway, tmp_path: Path) -> None:
    """n=16, max_tokens 1,000,000 after a 6,000-token prompt: the choices share the whole budget, the
    prompt on top."""
    backend = CountsBytes()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=8_000)))
    out = client.chat.completions.create(model="task_model", n=16, max_tokens=1_000_000,
                                         messages=[{"role": "user", "content": _rare(2000)}])
    assert len(out.choices) == 16
    assert _spent(gw)[0] <= 8_000, _spent(gw)


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_many_short_messages_of_multibyte_characters_do_not_undercut_the_prompts_bound(
        gw: Gateway, tmp_path: Path) -> None:
    """600 messages of 5 emoji each: 24 tokens a message (4 bytes an emoji, the template's 4), where a
    character count gives 5 and the body's bytes / 4 fewer than 24."""
    backend = CountsBytes()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=12_000)))
    status = _status(lambda: client.chat.completions.create(
        model="task_model", max_tokens=1, messages=[{"role": "user", "content": "😀🙃🤖🧠🔥"}] * 600))
    assert _spent(gw)[0] <= 12_000, _spent(gw)
    assert status == 429


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_a_prompt_hidden_in_tool_definitions_is_reserved_too(gw: Gateway, tmp_path: Path) -> None:
    """A one-letter message with 18,000 bytes of tool description: the provider renders tools into the
    prompt (and adds its tool-use preamble)."""
    backend = CountsBytes()
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=10_000)))
    tool = {"type": "function", "function": {"name": "f", "description": _rare(6000), "parameters": {}}}
    status = _status(lambda: client.chat.completions.create(
        model="task_model", max_tokens=1, tools=[tool], messages=[{"role": "user", "content": "x"}]))
    assert _spent(gw)[0] <= 10_000, _spent(gw)
    assert status == 429


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_long_prompts_to_a_pricey_model_stay_within_the_dollar_budget(gw: Gateway, tmp_path: Path) -> None:
    """4 requests at once to a $150/$600 per million model, each a $0.45 prompt and no max_tokens, on a
    $1 budget: the completion alone was held, at the output price."""
    backend = CountsBytes()
    token = _grant(gw, tmp_path, backend, budget=Budget(usd=1.0),
                   roles={"task_model": RoleModel(backend, "fake/pricey", price=PRICEY)})
    statuses = _at_once(gw, token, [{"messages": [{"role": "user", "content": _rare(1000)}]}] * 4)
    assert 200 in statuses
    rows = _rows(tmp_path / "run" / "usage.jsonl")
    assert sum(r["cost_usd"] for r in rows) <= 1.0 and _spent(gw)[1] <= 1.0, rows


@attack(env="gateway", cls="budget overshoot", invariant=6, defence="gateway-reservation")
def test_requests_omitting_max_tokens_with_long_prompts_stay_within_the_token_budget(
        gw: Gateway, tmp_path: Path) -> None:
    """8 requests at once, each a 6,000-token prompt and no max_tokens (the model would write 100,000):
    each held the unasked cap's completion, never its prompt."""
    from openrebench.gateway._server import CAP_UNASKED

    backend = CountsBytes()
    token = _grant(gw, tmp_path, backend, budget=Budget(tokens=30_000))
    statuses = _at_once(gw, token, [{"messages": [{"role": "user", "content": _rare(2000)}]}] * 8)
    assert 200 in statuses
    assert _spent(gw)[0] <= 30_000, _spent(gw)
    assert all(0 < b["max_tokens"] <= CAP_UNASKED for b in backend.bodies)  # imposed, not only held


# -- grants, models and keys -------------------------------------------------------------------------------

@attack(env="gateway", cls="grant escape", invariant=0)
def test_a_run_reaches_neither_another_runs_roles_nor_its_models_by_name(gw: Gateway, tmp_path: Path) -> None:
    """Name the other run's role or model, guess tokens, send the token in other headers."""
    mine, theirs = FakeBackend(), FakeBackend()
    token = _grant(gw, tmp_path, mine, run="a")
    _grant(gw, tmp_path, theirs, run="b", roles={"judge": RoleModel(theirs, "openai/gpt-4o", price=PRICE)})
    client = _client(gw, token)
    for model in ("judge", "openai/gpt-4o", "../judge", "task_model ", None):
        with pytest.raises(openai.APIStatusError):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    assert [m.id for m in client.models.list()] == ["task_model"] and theirs.bodies == []
    for header in (f"Bearer {token[:-1]}", f"Basic {token}", f"bearer  {token}x", "Bearer "):
        reply = _raw(gw.socket_path, _post("x", b"{}").replace(b"Bearer x", header.encode()))
        assert b" 401 " in reply.recv(4096).split(b"\r\n")[0]


@attack(env="gateway", cls="key leak", invariant=0)
def test_a_provider_error_quoting_the_key_does_not_reach_the_client_or_the_log(
        gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Provoke a provider error whose message quotes the harness's API key."""
    secret = "sk-harness-secret-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)

    class Leaky:
        async def generate(self, *args: Any, **kw: Any) -> Any:
            raise RuntimeError(f"Incorrect API key provided: {secret}. See the docs.")

    backend = InspectBackend("openai/gpt-4o")
    backend._model = Leaky()
    client = _client(gw, _grant(gw, tmp_path, backend, roles={"task_model": RoleModel(backend, "x/y")}))
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "x"}])
    assert "Incorrect API key" in e.value.message
    assert secret not in e.value.message + (tmp_path / "run" / "usage.jsonl").read_text()


# -- the gateway's memory and connections ---------------------------------------------------------------

@attack(env="gateway", cls="harness memory", invariant=5)
def test_many_large_requests_at_once_hold_only_the_runs_slots_worth_of_bodies(tmp_path: Path) -> None:
    """Open 40 connections each sending a body at the size limit: all read into the harness's memory."""
    gateway = Gateway(tmp_path / "gw.sock", max_body=64 * 1024, concurrency=2, shutdown_timeout_s=0.2)
    reads = []
    original = gateway._body

    async def counting(request: Any) -> Any:
        reads.append(request)
        return await original(request)

    gateway._body = counting  # type: ignore[method-assign]
    with gateway.start_in_thread():
        token = _grant(gateway, tmp_path, Hangs())
        body = json.dumps({"model": "task_model", "messages": [{"role": "user", "content": "x" * 60_000}]})
        conns = [_raw(gateway.socket_path, _post(token, body.encode())) for _ in range(40)]
        time.sleep(1.0)
        assert len(reads) <= 2, len(reads)
        for c in conns:
            c.close()


@attack(env="gateway", cls="denial of service", invariant=5)
def test_a_connection_that_sends_nothing_is_closed_soon(tmp_path: Path) -> None:
    """Slowloris: connections opened and left silent pile up in the harness's process (aiohttp: 75 s)."""
    from openrebench.gateway._server import KEEPALIVE_S

    assert KEEPALIVE_S <= 15
    gateway = Gateway(tmp_path / "gw.sock", keepalive_timeout_s=1.0)
    with gateway.start_in_thread():
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.connect(str(gateway.socket_path))
        idle.settimeout(5.0)
        try:
            assert idle.recv(1) == b""  # closed by the gateway
        except TimeoutError:
            pytest.fail("the gateway kept a silent connection open for 5 s")
        finally:
            idle.close()


@attack(env="gateway", cls="denial of service", invariant=5)
def test_requests_queued_past_a_runs_limit_are_refused_at_once(tmp_path: Path) -> None:
    """Queue hundreds of requests behind the run's busy slots: each holds a harness descriptor for 600 s."""
    gateway = Gateway(tmp_path / "gw.sock", concurrency=1, max_pending=8, shutdown_timeout_s=0.2)
    with gateway.start_in_thread():
        token = _grant(gateway, tmp_path, Hangs())
        body = _post(token, {"model": "task_model", "messages": [{"role": "user", "content": "x"}]})
        held = [_raw(gateway.socket_path, body) for _ in range(8)]
        time.sleep(0.3)
        extra = _raw(gateway.socket_path, body)
        extra.settimeout(5.0)
        try:
            assert b" 429 " in extra.recv(4096).split(b"\r\n")[0]
        finally:
            for c in [*held, extra]:
                c.close()


class OneAtATime(FakeBackend):
    """A shared upstream that serves one request at a time, and says so (`capacity`), as the local
    llama.cpp server says it has a few slots."""

    capacity = 1

    def __init__(self, delay_s: float) -> None:
        super().__init__(delay_s)
        self.lock: asyncio.Lock | None = None
        self.asked = self.calls_now = self.most_calls = 0

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.asked += 1
        self.calls_now += 1
        self.most_calls = max(self.most_calls, self.calls_now)
        self.lock = self.lock or asyncio.Lock()
        try:
            async with self.lock:
                return await super().chat(body)
        finally:
            self.calls_now -= 1


@attack(env="gateway", cls="denial of service", invariant=5)
def test_one_run_flooding_a_shared_backend_does_not_starve_another_runs_scorer(
        gw: Gateway, tmp_path: Path) -> None:
    """Flood the shared (local) model with the run's 16 slots so that other runs' judges time out."""
    shared = OneAtATime(delay_s=0.1)
    hog = _grant(gw, tmp_path, shared, run="hog")
    victim = _client(gw, _grant(gw, tmp_path, shared, run="victim"))
    (hog_grant,) = [g for g in gw._grants.values() if g.token == hog]
    flood = threading.Thread(target=_flood, args=(gw, hog, 16), daemon=True)
    flood.start()
    deadline = time.monotonic() + 10
    while hog_grant.pending < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hog_grant.pending == 16  # the whole flood is in, queued behind the backend's one place
    t0 = time.monotonic()
    victim.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "judge"}])
    waited = time.monotonic() - t0
    flood.join()
    # One of the hog's requests ahead (0.1 s) and the victim's own (0.1 s), not the 16 queued (1.6 s).
    assert waited < 0.5, f"the other run's request waited {waited:.1f} s behind the flood"
    assert shared.asked == 17 and shared.most_calls == 1  # never more at once than it serves


@attack(env="gateway", cls="denial of service", invariant=5)
def test_a_run_cannot_hold_more_connections_open_than_its_limit(tmp_path: Path) -> None:
    """Keep dozens of keep-alive connections open on the run's socket, each with a cheap authorised request.

    A sandbox is shown its grant's own socket alone (the agent's, or one scoring's), whose connections
    are counted as they are accepted: those over the limit are answered 429 and closed at once."""
    gateway = Gateway(tmp_path / "gw.sock", max_pending=8)
    with gateway.start_in_thread():
        own = tmp_path / "grant" / "gateway.sock"
        token = gateway.grant(roles={"task_model": RoleModel(FakeBackend(), "fake/model")},
                              usage_path=tmp_path / "run" / "usage.jsonl", socket_path=own).token
        ask = (f"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n\r\n").encode()
        conns = [_raw(own, ask) for _ in range(40)]
        try:
            answers = []
            for c in conns:
                c.settimeout(5.0)
                answers.append(c.recv(65536).split(b"\r\n")[0])
            time.sleep(0.3)
            open_now = 0
            for c in conns:
                c.setblocking(False)
                try:
                    open_now += c.recv(1) != b""
                except BlockingIOError:
                    open_now += 1
            assert open_now <= 8, f"{open_now} connections of one run held open"
            assert answers.count(b"HTTP/1.1 200 OK") == 8
            assert answers.count(b"HTTP/1.1 429 Too Many Requests") == 32
        finally:
            for c in conns:
                c.close()
        # Closed connections free their places; the socket answers its own grant's token only.
        other = gateway.grant(roles={"task_model": RoleModel(FakeBackend(), "fake/model")},
                              usage_path=tmp_path / "other" / "usage.jsonl").token
        time.sleep(0.2)
        for who, status in ((token, b"200"), (other, b"401")):
            c = _raw(own, ask.replace(token.encode(), who.encode()))
            c.settimeout(5.0)
            assert c.recv(65536).split(b"\r\n")[0].split(b" ")[1] == status
            c.close()
        gateway.revoke(token)
        assert not own.exists()  # a revoked grant's socket is gone


# -- from inside the agent's sandbox ----------------------------------------------------------------------

@needs_bwrap
@attack(env="gateway", cls="usage log forgery", invariant=6)
def test_the_usage_log_and_the_gateways_folder_are_out_of_the_agents_reach(open_box: Any) -> None:
    """Read or rewrite the run's usage log, or replace the gateway's socket, from the agent's sandbox."""
    box = open_box(model_budget_tokens=100_000)
    log = box.run.path / "gateway" / "usage.jsonl"
    box.sh("true")
    assert box.python("import json, openai; openai.OpenAI(max_retries=0).chat.completions.create(model="
                      "'judge', messages=[{'role': 'user', 'content': 'x'}]); print(json.dumps(1))") == 1
    before = log.read_bytes()
    out = box.sh(f"cat {shlex.quote(str(log))}; echo '{{}}' >> {shlex.quote(str(log))}; "
                 "find / -name usage.jsonl -o -name grant.json 2>/dev/null; "
                 "rm -f /run/openrebench/gateway/gateway.sock; touch /run/openrebench/gateway/x; "
                 "ls -A /run/openrebench/gateway")
    assert log.read_bytes() == before
    assert "usage.jsonl" not in out.stdout and "grant.json" not in out.stdout
    assert out.stdout.split() == ["gateway.sock"], out.stdout


@needs_bwrap
@attack(env="gateway", cls="direct backend access", invariant=0)
def test_the_agent_cannot_reach_a_server_on_the_hosts_loopback_nor_the_local_models_key(
        open_box: Any) -> None:
    """Talk to the local llama.cpp server directly (it listens on the host's 127.0.0.1), or read its key."""
    from openrebench.base import cache_dir

    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(8)
    port = host.getsockname()[1]
    accepted: list[Any] = []
    threading.Thread(target=lambda: accepted.append(host.accept()), daemon=True).start()
    box = open_box()
    probe = (f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
             " print('open')\nexcept OSError as e:\n print('refused', e)")
    out = box.sh(f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}; "
                 f"ls -A {shlex.quote(str(cache_dir()))} 2>&1; "
                 f"ls -A {shlex.quote(os.path.expanduser('~'))} 2>&1 | head -3")
    host.close()
    assert accepted == [] and "open" not in out.stdout.split(), out.stdout
    assert "local-model" not in out.stdout and "server.json" not in out.stdout


@attack(env="gateway", cls="held-out data through the model server's cache", invariant=3,
        defence="held-out-server")
def test_the_agent_cannot_read_a_scorings_prompts_from_the_offline_models_cache(tmp_path: Path) -> None:
    """llama.cpp keeps recent prompts and says how many tokens of a new one it found kept
    (`cached_tokens`; a kept prompt also answers faster). A scoring sends the offline model a held-out
    problem; afterwards the agent, with its own grant on the same run, sends guesses of that problem's
    text and reads which were kept. The run's scorings reach a server of their own: nothing is kept
    for the agent. (The probe works: the agent's own repeated prompt is found kept.)"""
    from types import SimpleNamespace

    from openrebench.gateway import ModelService
    from openrebench.harness._run_models import RunModels

    service = ModelService()  # its own gateway and servers, let go at the end
    run: Any = SimpleNamespace(path=tmp_path / "run")
    models = RunModels({"task_model": "local"}, Budget(tokens=100_000), service=service)
    held_out = "Problem 17 (held out): count the pairs of a_1..a_n whose xor is prime, modulo 998244353. " * 5

    def cached(token: str, text: str) -> int:
        transport = httpx.HTTPTransport(uds=str(service.socket_path))
        client = openai.OpenAI(base_url="http://gateway/v1", api_key=token, max_retries=0,
                               http_client=httpx.Client(transport=transport))
        out = client.chat.completions.create(model="task_model", max_tokens=1,
                                             messages=[{"role": "user", "content": text}])
        details = out.usage.prompt_tokens_details if out.usage else None
        return (details.cached_tokens or 0) if details else 0

    try:
        agent = models.agent(run).token  # the attempt's grant: held from its start to its end
        with models.scoring(run, False) as access:
            cached(access.env["OPENAI_API_KEY"], held_out)
        guess = cached(agent, held_out)
        own = "The agent's own notes, sent twice, long enough to be kept by the server's cache. " * 5
        cached(agent, own)
        assert cached(agent, own) > 0  # the agent's probe reads its own server's cache
        assert guess == 0, f"{guess} tokens of the scoring's held-out prompt were found in the agent's server"
    finally:
        models.close()
        service.close()


@attack(env="gateway", cls="held-out data through the model server's cache", invariant=3,
        defence="held-out-server")
def test_a_scoring_cannot_read_another_scorings_prompts_from_the_offline_models_cache(tmp_path: Path) -> None:
    """The same probe from inside a scoring: code that runs during a scoring (a scaffold) asks which of
    its guesses of another scoring's held-out prompt the model server kept, and carries what it learns
    out through its own score. Each scoring reaches a server of its own, started for its grant and gone
    with it: nothing of an earlier scoring is kept, nor of one running beside it. (The probe works
    within one scoring: its own repeated prompt is found kept.)"""
    from types import SimpleNamespace

    from openrebench.gateway import ModelService
    from openrebench.harness._run_models import RunModels

    service = ModelService()
    models = RunModels({"task_model": "local"}, Budget(tokens=100_000), service=service)
    first: Any = SimpleNamespace(path=tmp_path / "run-1")
    second: Any = SimpleNamespace(path=tmp_path / "run-2")  # another run of the same eval
    held_out = "Problem 9 (held out): the least k such that the k-th Fibonacci number ends in n zeros. " * 5
    own = "The scaffold's own prompt, sent twice, long enough to be kept by the server's cache. " * 5

    def cached(token: str, text: str) -> int:
        transport = httpx.HTTPTransport(uds=str(service.socket_path))
        client = openai.OpenAI(base_url="http://gateway/v1", api_key=token, max_retries=0,
                               http_client=httpx.Client(transport=transport))
        out = client.completions.create(model="task_model", max_tokens=1, prompt=text)
        details = out.usage.prompt_tokens_details if out.usage else None
        return (details.cached_tokens or 0) if details else 0

    try:
        with service.keep_local(), models.scoring(first, False) as earlier:
            cached(earlier.env["OPENAI_API_KEY"], held_out)
            with models.scoring(second, False) as beside:  # at the same time, as two runs' scorings may be
                during = cached(beside.env["OPENAI_API_KEY"], held_out)
            with models.scoring(second, False) as later:
                after = cached(later.env["OPENAI_API_KEY"], held_out)
                cached(later.env["OPENAI_API_KEY"], own)
                assert cached(later.env["OPENAI_API_KEY"], own) > 0  # the probe reads its server's cache
        assert during == 0 and after == 0, (
            f"{during} and {after} tokens of another scoring's held-out prompt were found kept")
    finally:
        models.close()
        service.close()
