"""The model gateway: OpenAI clients and curl over its Unix socket and through the sandbox's forwarder,
budgets, role isolation, the usage log, hostile requests, and both backends (Inspect's mockllm, a fake
OpenAI-compatible upstream)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from openrebench.base import OpenRebenchError
from openrebench.gateway import (
    Budget,
    Gateway,
    InspectBackend,
    OpenAICompatibleBackend,
    RoleModel,
    UsageLog,
    install_forwarder,
)
from openrebench.gateway._server import prompt_bound

PRICE = {"input": 1000.0, "output": 2000.0}  # US$ per 1M tokens: 10 in + 5 out = $0.02 a request


class FakeBackend:
    """Answers at once with the last user message echoed, 10 prompt and 5 completion tokens."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.delay_s = delay_s
        self.in_flight = self.most_in_flight = 0

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        text = f"echo: {body['messages'][-1]['content']}"
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "upstream",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "upstream",
                "choices": [{"index": 0, "text": f"{body['prompt']}!", "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class Hangs(FakeBackend):
    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Breaks(FakeBackend):
    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("secret detail of the harness")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path / "gw" / "gateway.sock", tcp_port=0, max_body=64 * 1024)
    with gateway.start_in_thread():
        yield gateway


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


def _grant(gw: Gateway, tmp_path: Path, backend: Any, run: str = "run", **kw: Any) -> str:
    roles = kw.pop("roles", None) or {"task_model": RoleModel(backend, "fake/model", price=PRICE)}
    return gw.grant(roles=roles, usage_path=tmp_path / run / "usage.jsonl", **kw).token


def _client(gw: Gateway, token: str) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=str(gw.socket_path))
    return openai.OpenAI(base_url="http://gateway/v1", api_key=token, max_retries=0,
                         http_client=httpx.Client(transport=transport))


def _aclient(gw: Gateway, token: str) -> openai.AsyncOpenAI:
    transport = httpx.AsyncHTTPTransport(uds=str(gw.socket_path))
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=token, max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport))


def _ask(client: openai.OpenAI, model: str = "task_model", text: str = "hi") -> str:
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return out.choices[0].message.content or ""


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _bound(text: str = "hi") -> int:
    """What the gateway reserves for the prompt of `_ask(client, text=text)`."""
    return prompt_bound("chat", {"messages": [{"role": "user", "content": text}], "model": "task_model"})


# -- clients ---------------------------------------------------------------------------------------------

def test_the_openai_client_speaks_to_the_unix_socket(gw: Gateway, tmp_path: Path,
                                                     backend: FakeBackend) -> None:
    client = _client(gw, _grant(gw, tmp_path, backend))
    out = client.chat.completions.create(model="task_model", temperature=0.2,
                                         messages=[{"role": "user", "content": "hello"}])
    assert out.choices[0].message.content == "echo: hello"
    assert out.model == "fake/model" and out.usage is not None and out.usage.total_tokens == 15
    assert backend.bodies[-1]["temperature"] == 0.2
    assert _ask(client, model="fake/model") == "echo: hi"  # the role's model name works as well
    assert [m.id for m in client.models.list()] == ["task_model"]
    done = client.completions.create(model="task_model", prompt="one")
    assert done.choices[0].text == "one!" and done.usage is not None and done.usage.completion_tokens == 1
    chunks = list(client.completions.create(model="task_model", prompt="two", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "two!" and chunks[0].model == "fake/model"
    log = (tmp_path / "run" / "usage.jsonl").read_text()
    assert len(log.splitlines()) == 4 and client.api_key not in log  # every call metered, no token kept


def test_the_async_client_streams_and_32_requests_at_once_are_all_answered_and_counted(
        gw: Gateway, tmp_path: Path) -> None:
    backend = FakeBackend(delay_s=0.01)
    token = _grant(gw, tmp_path, backend, concurrency=4)

    async def main() -> tuple[list[str], str, Any]:
        async with _aclient(gw, token) as client:
            async def one(i: int) -> str:
                out = await client.chat.completions.create(
                    model="task_model", messages=[{"role": "user", "content": str(i)}])
                return out.choices[0].message.content or ""

            answers = await asyncio.gather(*(one(i) for i in range(32)))
            stream = await client.chat.completions.create(
                model="task_model", messages=[{"role": "user", "content": "flow"}], stream=True,
                stream_options={"include_usage": True})
            text, usage = "", None
            async for chunk in stream:
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage or usage
            return answers, text, usage

    answers, text, usage = asyncio.run(main())
    assert sorted(answers) == sorted(f"echo: {i}" for i in range(32))
    assert text == "echo: flow" and usage is not None and usage.total_tokens == 15
    assert backend.most_in_flight <= 4  # the grant's concurrency limit held
    totals = UsageLog(tmp_path / "run" / "usage.jsonl").totals()
    assert (totals.requests, totals.failures, totals.tokens) == (33, 0, 33 * 15)


@pytest.fixture
def forwarder(gw: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    script = install_forwarder(tmp_path)
    proc = subprocess.Popen([sys.executable, str(script), str(gw.socket_path), "0"], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening on 127.0.0.1:"), line
        yield int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_unmodified_client_works_through_the_forwarder_with_only_a_base_url_and_key(
        gw: Gateway, tmp_path: Path, backend: FakeBackend, forwarder: int) -> None:
    token = _grant(gw, tmp_path, backend)
    base = f"http://127.0.0.1:{forwarder}/v1"
    client = openai.OpenAI(base_url=base, api_key=token)
    assert _ask(client, text="via tcp") == "echo: via tcp"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()

    async def many() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base, api_key=token) as aclient:
            outs = await asyncio.gather(*(aclient.chat.completions.create(
                model="task_model", messages=[{"role": "user", "content": str(i)}]) for i in range(32)))
        return [o.choices[0].message.content or "" for o in outs]

    assert sorted(asyncio.run(many())) == sorted(f"echo: {i}" for i in range(32))


@contextlib.contextmanager
def _forwarding_to(tmp_path: Path, sock: Path) -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, str(install_forwarder(tmp_path)), str(sock), "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield int((proc.stdout.readline() if proc.stdout else "").rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _Shout(socketserver.StreamRequestHandler):
    """Reads to the end of what the client sends, then answers it upper-cased and closes."""

    def handle(self) -> None:
        self.wfile.write(self.rfile.read().upper())


def test_the_forwarder_relays_bytes_and_half_closes_both_ways_and_answers_503_without_the_gateway(
        gw: Gateway, tmp_path: Path, backend: FakeBackend, forwarder: int) -> None:
    shout = socketserver.ThreadingUnixStreamServer(str(tmp_path / "shout.sock"), _Shout)
    threading.Thread(target=shout.serve_forever, daemon=True).start()
    try:
        with _forwarding_to(tmp_path, tmp_path / "shout.sock") as port, \
                socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"half " * 50_000 + bytes(range(256)))
            conn.shutdown(socket.SHUT_WR)  # the server answers only once it sees the end: it must get it
            reply = b"".join(iter(lambda: conn.recv(65536), b""))
        assert reply == (b"half " * 50_000 + bytes(range(256))).upper()
    finally:
        shout.shutdown()
        shout.server_close()

    token = _grant(gw, tmp_path, backend)
    body = json.dumps({"model": "task_model", "messages": [{"role": "user", "content": "raw"}]}).encode()
    with socket.create_connection(("127.0.0.1", forwarder)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + token.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        reply = b"".join(iter(lambda: conn.recv(65536), b""))  # ends when the gateway closes
    assert reply.startswith(b"HTTP/1.1 200") and b"echo: raw" in reply

    with _forwarding_to(tmp_path, tmp_path / "missing.sock") as port:
        with pytest.raises(openai.InternalServerError) as e:
            _ask(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0))
        assert e.value.status_code == 503 and "gateway cannot be reached" in e.value.message


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_through_the_unix_socket_and_the_forwarder(gw: Gateway, tmp_path: Path, backend: FakeBackend,
                                                        forwarder: int) -> None:
    token = _grant(gw, tmp_path, backend)
    body = json.dumps({"model": "task_model", "messages": [{"role": "user", "content": "curl"}]})
    for how in (["--unix-socket", str(gw.socket_path), "http://gateway/v1/chat/completions"],
                [f"http://127.0.0.1:{forwarder}/v1/chat/completions"]):
        out = subprocess.run(["curl", "-sS", "--noproxy", "*", *how, "-H", f"Authorization: Bearer {token}",
                              "-H", "Content-Type: application/json", "-d", body],
                             capture_output=True, text=True, check=True)
        assert json.loads(out.stdout)["choices"][0]["message"]["content"] == "echo: curl"
    big = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket",
                          str(gw.socket_path), "http://gateway/v1/chat/completions", "-H",
                          f"Authorization: Bearer {token}", "--data-binary", "@-"],
                         input="x" * (65 * 1024), capture_output=True, text=True, check=True)
    assert big.stdout == "413"


# -- budgets and isolation ------------------------------------------------------------------------------

def test_a_spent_dollar_budget_is_429_naming_it_and_the_client_does_not_retry(
        gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    # Each request holds its prompt's bound ($0.001 a token) and a completion token ($0.002) at least.
    usd = _bound() * 0.001 + 0.002 + 0.04 - 0.0005
    client = openai.OpenAI(base_url="http://gateway/v1", api_key=_grant(gw, tmp_path, backend,
                                                                         budget=Budget(usd=usd)),
                           http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket_path))))
    _ask(client)
    _ask(client)  # $0.02 spent: the worst case still fits
    with pytest.raises(openai.RateLimitError) as e:  # $0.04 spent: it does not
        _ask(client)
    assert "dollar budget" in e.value.message and f"{_bound()} prompt tokens" in e.value.message
    assert e.value.code == "budget_exceeded" and e.value.type == "budget_exceeded"
    assert [r["status"] for r in _rows(tmp_path / "run" / "usage.jsonl")] == [200, 200, 429]  # no retries
    client.close()
    spent = gw._grants[next(iter(gw._grants))]
    spent.usage.record(grant=spent.run_id, role="task_model", model="fake/model", endpoint="chat", status=200,
                       prompt_tokens=_bound() + 10, price=PRICE)  # spent past it (as by an older gateway)
    with pytest.raises(openai.RateLimitError) as e:
        _ask(_client(gw, spent.token))
    assert f"${spent.totals().cost_usd:.4f} of its ${usd:.4f} dollar budget" in e.value.message


def test_a_spent_token_budget_is_429_naming_it(gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(usd=100.0, tokens=_bound() + 15)))
    _ask(client)  # the prompt's bound and 15 completion tokens held; 15 tokens spent
    assert backend.bodies[0]["max_tokens"] == 15
    with pytest.raises(openai.RateLimitError) as e:
        _ask(client)
    assert "token budget" in e.value.message and "budget exceeded" in e.value.message
    assert backend.bodies and len(backend.bodies) == 1  # the refused call never reached the backend


def test_a_reply_cap_cuts_every_request_to_it_budget_or_not(gw: Gateway, tmp_path: Path,
                                                            backend: FakeBackend) -> None:
    """A tier's `reply_tokens` (rust_codecontests' mini: 256) reaches the backend as `max_tokens`, whatever
    was asked (more, less, nothing, `max_completion_tokens`), with or without a token budget; under a
    budget the request holds the cut cap, not the asked one."""
    capped = _client(gw, _grant(gw, tmp_path, backend, run="a", budget=Budget(reply_tokens=256)))
    for asked in ({"max_tokens": 512}, {"max_tokens": 100}, {}, {"max_completion_tokens": 4096}):
        capped.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "hi"}],
                                       **asked)
    caps = [b.get("max_tokens", b.get("max_completion_tokens")) for b in backend.bodies]
    assert caps == [256, 100, 256, 256]
    backend.bodies.clear()
    room = _bound() + 1000  # room for 1000 completion tokens: 2 choices of 500 each, cut to 256
    budgeted = _client(gw, _grant(gw, tmp_path, backend, run="b",
                                  budget=Budget(tokens=room, reply_tokens=256)))
    budgeted.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2000, n=2)
    assert backend.bodies[0]["max_tokens"] == 256
    uncapped = _client(gw, _grant(gw, tmp_path, backend, run="c"))
    _ask(uncapped)
    assert "max_tokens" not in backend.bodies[-1]  # no budget, no cap: the request as it was


def test_a_run_reaches_only_its_own_roles_and_a_revoked_token_nothing(gw: Gateway, tmp_path: Path,
                                                                      backend: FakeBackend) -> None:
    mine = _grant(gw, tmp_path, backend, run="a")
    theirs = _grant(gw, tmp_path, FakeBackend(), run="b",
                    roles={"judge": RoleModel(FakeBackend(), "fake/judge", price=PRICE)})
    client, other = _client(gw, mine), _client(gw, theirs)
    for name in ("judge", "fake/judge", "gpt-4o"):
        with pytest.raises(openai.NotFoundError) as e:
            _ask(client, model=name)
        assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        _ask(other, model="task_model")
    assert [m.id for m in other.models.list()] == ["judge"]
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve("task_model")
    gw.revoke(mine)
    with pytest.raises(openai.AuthenticationError):
        _ask(client)
    with pytest.raises(openai.AuthenticationError):
        _client(gw, mine[:-1]).models.list()
    bare = httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket_path)))
    assert bare.get("http://gateway/v1/models").json()["error"]["code"] == "invalid_api_key"
    assert _ask(other, model="judge") == "echo: hi"


def test_a_dollar_budget_needs_prices(gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    roles = {"task_model": RoleModel(backend, "local/unknown-model")}
    with pytest.raises(OpenRebenchError, match="needs a price for local/unknown-model"):
        gw.grant(roles=roles, usage_path=tmp_path / "usage.jsonl", budget=Budget(usd=1.0))
    token = gw.grant(roles=roles, usage_path=tmp_path / "usage.jsonl", budget=Budget(tokens=1000)).token
    _ask(_client(gw, token))
    totals = UsageLog(tmp_path / "usage.jsonl").totals()
    assert (totals.cost_usd, totals.priced, totals.tokens) == (0.0, False, 15)


class OneChoiceUsage(FakeBackend):
    """As llama.cpp's server: `n` choices, but the usage counts the completion tokens of one."""

    usage_counts_one_choice = True

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        out = await super().chat(body)
        out["choices"] = [{**out["choices"][0], "index": i} for i in range(int(body.get("n", 1)))]
        return out


def test_choices_a_backend_leaves_out_of_its_usage_are_charged(gw: Gateway, tmp_path: Path) -> None:
    token = _grant(gw, tmp_path, OneChoiceUsage(), budget=Budget(tokens=64 + _bound("w")))
    client = _client(gw, token)
    out = client.chat.completions.create(model="task_model", n=3, messages=[{"role": "user", "content": "x"}])
    assert len(out.choices) == 3
    (row,) = _rows(tmp_path / "run" / "usage.jsonl")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (10, 15)  # 5 per choice, not 5 in all
    _ask(client, text="y")  # 25 + 15 = 40 tokens: under 60
    client.chat.completions.create(model="task_model", n=3, messages=[{"role": "user", "content": "z"}])
    with pytest.raises(openai.RateLimitError):  # 65 spent; counted one choice each, 45 would leave room
        _ask(client, text="w")


def test_a_backend_writing_past_what_was_held_is_charged_it_and_the_row_says_so(
        gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    # FakeBackend writes 5 tokens whatever max_tokens says: 2 held, 5 charged, nothing more admitted.
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=_bound() + 2)))
    _ask(client)
    assert backend.bodies[0]["max_tokens"] == 2
    with pytest.raises(openai.RateLimitError):
        _ask(client)
    row = _rows(tmp_path / "run" / "usage.jsonl")[0]
    assert row["completion_tokens"] == 5
    assert row["error"] == "the backend reported 3 token(s) more than the gateway reserved"


def test_parts_and_templates_whose_prompt_has_no_bound_are_refused_before_the_backend(
        gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    client = _client(gw, _grant(gw, tmp_path, backend, budget=Budget(tokens=100_000)))
    image = {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}}
    with pytest.raises(openai.BadRequestError, match="only text content parts"):
        client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": [image]}])
    loop = "{% for i in range(9**9) %}{{ messages[0].content }}{% endfor %}"  # vLLM renders it
    with pytest.raises(openai.BadRequestError, match="chat_template"):
        client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"chat_template": loop})
    assert backend.bodies == []
    text = {"type": "text", "text": "hi"}
    assert client.chat.completions.create(model="task_model", messages=[{"role": "user", "content": [text]}])


# -- the usage log ---------------------------------------------------------------------------------------

def test_every_request_is_a_row_and_the_totals_survive_a_restart(tmp_path: Path,
                                                                 backend: FakeBackend) -> None:
    usage = tmp_path / "run" / "usage.jsonl"
    roles = {"task_model": RoleModel(backend, "fake/model", price=PRICE)}
    first = Gateway(tmp_path / "gw.sock")
    with first.start_in_thread():
        client = _client(first, first.grant(roles=roles, usage_path=usage, run_id="run-7").token)
        _ask(client)
        client.completions.create(model="task_model", prompt="p")
        with pytest.raises(openai.NotFoundError):
            _ask(client, model="other")
    rows = _rows(usage)
    assert [(r["endpoint"], r["status"], r["role"]) for r in rows] == [
        ("chat", 200, "task_model"), ("completions", 200, "task_model"), ("chat", 404, None)]
    assert rows[0]["grant"] == "run-7" and rows[0]["model"] == "fake/model"
    assert rows[0]["cost_usd"] == pytest.approx(0.02) and rows[0]["latency_s"] >= 0
    assert rows[2]["error"].startswith("The model 'other' does not exist")
    assert set(rows[0]) >= {"time", "grant", "role", "model", "endpoint", "prompt_tokens",
                            "completion_tokens", "cost_usd", "latency_s", "status", "error"}

    second = Gateway(tmp_path / "gw.sock")  # a restarted gateway: the same run granted again
    with second.start_in_thread():
        grant = second.grant(roles=roles, usage_path=usage, budget=Budget(tokens=_bound() + 24),
                             run_id="run-7")
        # Another id writing to the same log spends apart: a budget counts its own grant's rows.
        assert second.grant(roles=roles, usage_path=usage, run_id="run-7/scoring").totals().requests == 0
        t = grant.totals()
        assert (t.prompt_tokens, t.completion_tokens, t.requests, t.failures) == (13, 6, 3, 1)
        assert t.cost_usd == pytest.approx(0.02 + 0.005) and t.priced
        _ask(_client(second, grant.token))  # 19 spent: room for the prompt's bound and 5 tokens
        with pytest.raises(openai.RateLimitError):
            _ask(_client(second, grant.token))
    assert UsageLog(usage).totals().requests == 5


def test_a_torn_usage_line_is_skipped_and_the_next_row_starts_on_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    log = UsageLog(path)
    log.record(grant="r", role="task_model", model="m", endpoint="chat", status=200, prompt_tokens=4,
               completion_tokens=2, price={"input": 1e6, "output": 1e6})
    with path.open("a") as f:
        f.write('{"time": "2026-01-01", "prompt_tok')  # a gateway killed mid-row
    again = UsageLog(path)
    assert again.skipped == 1 and again.totals().tokens == 6 and again.totals().cost_usd == pytest.approx(6)
    again.record(grant="r", role="task_model", model="m", endpoint="chat", status=429)
    assert [r["status"] for r in again.rows()] == [200, 429]
    assert UsageLog(path).totals().requests == 2 and UsageLog(path).totals().failures == 1


# -- hostile and failing requests -----------------------------------------------------------------------

def test_bad_json_an_oversized_body_and_a_missing_model_are_clean_openai_errors(
        gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    token = _grant(gw, tmp_path, backend)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket_path)), base_url="http://gateway",
                        headers={"Authorization": f"Bearer {token}"})
    for content, status, code in ((b"{not json", 400, "invalid_json"), (b"[1, 2]", 400, "invalid_json"),
                                  (b"{}", 400, "model_required"), (b"\xff\xfe", 400, "invalid_json")):
        reply = http.post("/v1/chat/completions", content=content)
        assert (reply.status_code, reply.json()["error"]["code"]) == (status, code)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold while reading
        yield b'{"model": "task_model", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}]}'

    reply = http.post("/v1/chat/completions", content=chunks())
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as e:
        _ask(_client(gw, token), text="x" * (100 * 1024))
    assert e.value.status_code == 413
    assert http.get("/nowhere").json()["error"]["message"] == "Not Found"
    assert http.get("/health").json() == {"status": "ok"}
    assert len(backend.bodies) == 0
    assert [r["status"] for r in _rows(tmp_path / "run" / "usage.jsonl")] == [400, 400, 400, 400, 413, 413]


def test_a_hanging_backend_is_504_and_a_broken_one_502_without_its_details(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path / "gw.sock", request_timeout_s=0.2)
    with gateway.start_in_thread():
        token = gateway.grant(roles={"slow": RoleModel(Hangs(), "fake/slow", price=PRICE),
                                     "bad": RoleModel(Breaks(), "fake/bad", price=PRICE)},
                              usage_path=tmp_path / "usage.jsonl").token
        client = _client(gateway, token)
        with pytest.raises(openai.InternalServerError) as e:
            _ask(client, model="slow")
        assert e.value.status_code == 504 and "longer than 0.2 s" in e.value.message
        with pytest.raises(openai.InternalServerError) as e:
            _ask(client, model="bad")
        assert e.value.status_code == 502 and "secret" not in e.value.message
    assert [r["status"] for r in _rows(tmp_path / "usage.jsonl")] == [504, 502]


def test_the_gateway_is_an_async_context_manager(tmp_path: Path, backend: FakeBackend) -> None:
    async def main() -> str:
        async with Gateway(tmp_path / "gw.sock", tcp_port=0) as gateway:
            token = _grant(gateway, tmp_path, backend)
            assert gateway.base_url is not None
            async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=token, max_retries=0,
                                          http_client=httpx.AsyncClient(trust_env=False)) as client:
                out = await client.chat.completions.create(
                    model="task_model", messages=[{"role": "user", "content": "tcp"}])
        return out.choices[0].message.content or ""

    assert asyncio.run(main()) == "echo: tcp"


# -- backends --------------------------------------------------------------------------------------------

def test_inspect_backend_translates_requests_and_answers_with_mockllm(gw: Gateway, tmp_path: Path) -> None:
    from inspect_ai.model import (
        ChatCompletionChoice,
        ChatMessageAssistant,
        Logprob,
        Logprobs,
        ModelOutput,
        ModelUsage,
        TopLogprob,
    )
    from inspect_ai.tool import ToolCall

    seen: list[tuple[list[Any], list[Any], Any]] = []

    def outputs(messages: list[Any], tools: list[Any], tool_choice: Any, config: Any) -> ModelOutput:
        seen.append((messages, tools, config))
        lp = Logprobs(content=[Logprob(token="ok", logprob=-0.25, top_logprobs=[
            TopLogprob(token="ok", logprob=-0.25), TopLogprob(token="no", logprob=-1.5)])])
        calls = [ToolCall(id="call_1", function="add", arguments={"a": 1})] if tools else None
        choices = [ChatCompletionChoice(message=ChatMessageAssistant(content=f"ok {i}", tool_calls=calls),
                                        stop_reason="tool_calls" if calls else "max_tokens", logprobs=lp)
                   for i in range(config.num_choices or 1)]
        return ModelOutput(model="mockllm/model", choices=choices,
                           usage=ModelUsage(input_tokens=7, output_tokens=3, total_tokens=10))

    mock = InspectBackend("mockllm/model", custom_outputs=outputs)
    client = _client(gw, _grant(gw, tmp_path, None, roles={"task_model": RoleModel(mock, "mockllm/model")}))
    out = client.chat.completions.create(
        model="task_model", n=2, temperature=0.5, max_tokens=20, stop="END", top_p=0.9, seed=3, logprobs=True,
        top_logprobs=2, messages=[{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "say ok"}]},
                                  {"role": "assistant", "content": "ok?"},
                                  {"role": "user", "content": "again"}])
    messages, _, config = seen[-1]
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1].text == "say ok"
    assert (config.num_choices, config.temperature, config.max_tokens, config.stop_seqs, config.top_p,
            config.seed, config.logprobs, config.top_logprobs) == (2, 0.5, 20, ["END"], 0.9, 3, True, 2)
    assert [c.message.content for c in out.choices] == ["ok 0", "ok 1"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (7, 3)
    top = out.choices[0].logprobs.content[0].top_logprobs  # type: ignore[union-attr]
    assert [(t.token, t.logprob) for t in top] == [("ok", -0.25), ("no", -1.5)]

    tool = {"type": "function", "function": {"name": "add", "description": "adds", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    called = client.chat.completions.create(model="mockllm/model", tools=[tool],  # type: ignore[list-item]
                                            messages=[{"role": "user", "content": "add"}])
    assert seen[-1][1][0].name == "add" and called.choices[0].finish_reason == "tool_calls"
    call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1})  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="task_model", prompt="x")
    assert "no text completions endpoint" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="task_model", messages=[{"role": "wizard", "content": "x"}])  # type: ignore[misc,list-item]


def _upstream(calls: dict[str, int], models: list[str]) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        calls["chat"] += 1
        body = await request.json()
        models.append(body["model"])
        if calls["chat"] <= 2:  # busy twice, then it answers
            return web.json_response({"error": {"message": "slow down"}}, status=429)
        if body["messages"][0]["content"] == "bad":
            return web.json_response({"error": {"message": "context too long"}}, status=400)
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": "up",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "up"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        models.append(body["model"])
        logprobs = {"tokens": [" a"], "token_logprobs": [-0.5], "top_logprobs": [{" a": -0.5, " b": -1.0}],
                    "text_offset": [0]}
        return web.json_response({"id": "t", "object": "text_completion", "created": 0, "model": "up",
                                  "choices": [{"index": 0, "text": " a", "logprobs": logprobs,
                                               "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    return app


def test_openai_compatible_backend_passes_through_retries_busy_upstreams_and_reports_them_down(
        tmp_path: Path) -> None:
    calls, models = {"chat": 0}, []

    async def main() -> None:
        runner = web.AppRunner(_upstream(calls, models), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        up = OpenAICompatibleBackend(f"http://127.0.0.1:{port}/v1", "upstream-name", backoff_s=0.001)
        down = OpenAICompatibleBackend(f"http://127.0.0.1:{dead}/v1", "x", retries=1, backoff_s=0.001)
        try:
            async with Gateway(tmp_path / "gw.sock") as gateway:
                token = gateway.grant(roles={"task_model": RoleModel(up, "local/llama", price=PRICE),
                                             "gone": RoleModel(down, "local/gone", price=PRICE)},
                                      usage_path=tmp_path / "usage.jsonl").token
                async with _aclient(gateway, token) as client:
                    done = await client.completions.create(model="task_model", prompt="p", logprobs=2,
                                                           max_tokens=1)
                    assert done.choices[0].text == " a" and done.model == "local/llama"
                    assert done.choices[0].logprobs is not None
                    assert done.choices[0].logprobs.top_logprobs == [{" a": -0.5, " b": -1.0}]
                    out = await client.chat.completions.create(model="task_model",
                                                               messages=[{"role": "user", "content": "hi"}])
                    assert out.choices[0].message.content == "up" and calls["chat"] == 3
                    with pytest.raises(openai.BadRequestError, match="context too long"):
                        await client.chat.completions.create(model="task_model",
                                                             messages=[{"role": "user", "content": "bad"}])
                    with pytest.raises(openai.InternalServerError) as e:
                        await client.chat.completions.create(model="gone",
                                                             messages=[{"role": "user", "content": "hi"}])
                    assert e.value.status_code == 503 and "cannot be reached" in e.value.message
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert set(models) == {"upstream-name"}  # the upstream's own name, whatever the client asked for
    rows = _rows(tmp_path / "usage.jsonl")
    assert [(r["endpoint"], r["status"], r["prompt_tokens"]) for r in rows] == [
        ("completions", 200, 2), ("chat", 200, 5), ("chat", 400, 0), ("chat", 503, 0)]  # retries uncharged
    assert UsageLog(tmp_path / "usage.jsonl").totals().failures == 2


def test_a_batch_of_echoes_is_not_bounded_by_the_servers_slots() -> None:
    """The likelihood judge scores 16 texts a request by echo (nothing generated): the offline server's 4
    slots bound generations, not echoes; a generating batch past them is still refused, saying so."""
    from openrebench.gateway._limits import Refusal, limit

    echo = {"prompt": ["Answer: yes"] * 16, "echo": True, "max_tokens": 0, "logprobs": 0}
    assert limit(echo, 10_000, 100, "the budget", max_choices=4) == 0
    with pytest.raises(Refusal, match="takes at most 4 choices"):
        limit({"prompt": ["Answer:"] * 16, "max_tokens": 5}, 10_000, 100, "the budget", max_choices=4)


def test_the_offline_model_stays_between_grants_while_kept_and_goes_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An eval whose environments use the offline model keeps it (`keep_local`): its server is started
    once for all the eval's scorings and the judge's weights are not dropped between them; without the
    hold, or once it ends, the model goes with the last grant as before."""
    from types import SimpleNamespace

    from openrebench.gateway import _service

    starts: list[int] = []
    stops: list[int] = []

    @contextlib.contextmanager
    def fake_server(*args: Any, **kwargs: Any) -> Iterator[Any]:
        starts.append(1)
        try:
            yield SimpleNamespace(base_url="http://127.0.0.1:9/v1", model="gemma-3-270m", api_key="k",
                                  parallel=4)
        finally:
            stops.append(1)

    monkeypatch.setattr(_service, "shared_local_server", fake_server)
    service = _service.ModelService()  # its sockets under the system temp folder (a short path)
    unloads: list[int] = []
    monkeypatch.setattr(service._likelihood, "unload", lambda: unloads.append(1))

    def one_scoring(run: str) -> None:
        grant = service.grant(tmp_path / run, {"judge": "local"})
        service.revoke(grant.token)

    try:
        one_scoring("a")
        assert (len(starts), len(stops), len(unloads)) == (1, 1, 1)  # not kept: gone with its grant
        with service.keep_local():
            one_scoring("b")
            one_scoring("c")
            assert (len(starts), len(stops), len(unloads)) == (2, 1, 1)  # one start for both scorings
        assert (len(starts), len(stops), len(unloads)) == (2, 2, 2)  # let go once the hold ends
    finally:
        service.close()


def test_each_held_out_grant_has_a_server_of_its_own_started_when_needed_and_stopped_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scoring's grant reaches `local` through a server nothing else reaches (its prompt cache holds
    held-out text): one per grant, even while the eval keeps the offline model, started by the first
    request that needs it (a grant that only echoes, as chat_rl's judge does, starts none), gone with the
    grant. The agent's side keeps the shared server."""
    from types import SimpleNamespace

    from openrebench.gateway import _service

    made: list[str] = []
    started: list[str] = []
    stopped: list[str] = []

    class FakeServer:
        parallel = 4

        def __init__(self, **kwargs: Any) -> None:
            self.base_url, self.api_key = f"http://127.0.0.1:9/v{len(made) + 1}", "k"
            made.append(self.base_url)

        def start(self) -> Any:
            started.append(self.base_url)
            return self

        def stop(self) -> None:
            if self.base_url in started:
                stopped.append(self.base_url)

    class FakeUpstream:
        def __init__(self, base_url: str, name: str, *args: Any, **kwargs: Any) -> None:
            self.base_url, self.name, self.capacity = base_url, name, kwargs.get("capacity")
            self.usage_counts_one_choice = True

        async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
            return {"served_by": self.base_url}

        async def aclose(self) -> None:
            pass

    monkeypatch.setattr(_service, "LocalModelServer", FakeServer)
    monkeypatch.setattr(_service, "OpenAICompatibleBackend", FakeUpstream)
    shared: list[int] = []

    @contextlib.contextmanager
    def fake_shared(*args: Any, **kwargs: Any) -> Iterator[Any]:
        shared.append(1)
        yield SimpleNamespace(base_url="http://127.0.0.1:9/shared", model="gemma-3-270m", api_key="k",
                              parallel=4)

    monkeypatch.setattr(_service, "shared_local_server", fake_shared)
    service = _service.ModelService()
    try:
        with service.keep_local():
            agent = service.grant(tmp_path / "a", {"task_model": "local"})
            one = service.grant(tmp_path / "a", {"task_model": "local"}, held_out=True)
            two = service.grant(tmp_path / "b", {"task_model": "local"}, held_out=True)
            assert started == []  # nothing asked yet
            ask = {"prompt": "p", "max_tokens": 1}
            served = [asyncio.run(g.roles["task_model"].backend.complete(ask))["served_by"]
                      for g in (one, two, one)]
            assert served[0] == served[2] != served[1] and started == served[:2]
            agents = asyncio.run(agent.roles["task_model"].backend.complete(ask))
            assert agents["served_by"].endswith("/shared")
            service.revoke(one.token)
            assert stopped == served[:1]  # gone with its grant, though the eval keeps the offline model
            service.revoke(two.token)
            assert stopped == served[:2]
            service.revoke(agent.token)
        assert shared == [1]
    finally:
        service.close()


def test_a_scorings_server_that_cannot_start_is_a_backend_error_naming_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scoring's own server failing to start (no model file, a llama.cpp error) reaches the client as
    the gateway's 503 with the server's one-line reason, and the grant still ends cleanly."""
    from openrebench.base import OpenRebenchError
    from openrebench.gateway import _backends, _service

    class BrokenServer:
        parallel = 4

        def __init__(self, **kwargs: Any) -> None:
            pass

        def start(self) -> Any:
            raise OpenRebenchError("the local model server exited (code 1) while loading x.gguf: bad magic")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(_service, "LocalModelServer", BrokenServer)
    service = _service.ModelService()
    try:
        grant = service.grant(tmp_path / "a", {"task_model": "local"}, held_out=True)
        with pytest.raises(_backends.BackendUnavailable, match="bad magic") as failed:
            asyncio.run(grant.roles["task_model"].backend.complete({"prompt": "p", "max_tokens": 1}))
        assert failed.value.status == 503
        service.revoke(grant.token)
    finally:
        service.close()


def test_a_models_name_is_known_without_starting_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run's grant.json records as served (`served_as`) costs no server start: the offline model's
    name is its own, a custom backend's the name it was added with, an Inspect model's its spec."""
    from openrebench.gateway import _service

    monkeypatch.setattr(_service, "shared_local_server", lambda **kw: pytest.fail("a server was started"))
    service = _service.ModelService()
    try:
        service.add_backend("mine", FakeBackend(0.0), "fake/model")
        assert [service.model_name(s) for s in ("local", "mine", "openai/gpt-4o-mini")] == [
            "gemma-3-270m", "fake/model", "openai/gpt-4o-mini"]
    finally:
        service.close()
