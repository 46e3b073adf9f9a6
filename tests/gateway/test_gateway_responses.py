# ruff: noqa: F811 - the fixtures imported from test_gateway are the tests' arguments
"""The gateway's Responses API (`POST /v1/responses`), served from the backend's chat completions: the
`openai` package's `client.responses` (whole, streamed, the stream helper), function tools both ways,
what a stateless gateway cannot serve refused by name, and Inspect's own `openai/` provider, which
speaks the Responses API to GPT-5 models, working against it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from test_gateway import PRICE, FakeBackend, _client, _rows, backend, gw  # noqa: F401
from test_gateway_streaming import WORDS, SlowUpstream, _settled, serving

from openrebench.gateway import Budget, Gateway, OpenAICompatibleBackend, RoleModel

ADD = {"type": "function", "name": "add", "description": "adds",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SlowUpstream, OpenAICompatibleBackend]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    fake = SlowUpstream(delay_s=0.1)
    with serving(fake.app()) as url:
        yield fake, OpenAICompatibleBackend(url, "upstream-name", backoff_s=0.001)


def _granted(gw: Gateway, tmp_path: Path, backend: Any, role: str = "task_model", **kw: Any) -> Any:
    return gw.grant(roles={role: RoleModel(backend, "fake/model", price=PRICE)},
                    usage_path=tmp_path / "run" / "usage.jsonl", **kw)


def test_a_response_is_answered_from_the_backends_chat_completion_and_metered_like_one(
        gw: Gateway, tmp_path: Path, backend: FakeBackend) -> None:
    grant = _granted(gw, tmp_path, backend, budget=Budget(tokens=100_000))
    client = _client(gw, grant.token)
    out = client.responses.create(model="task_model", input="hi", instructions="be brief",
                                  max_output_tokens=50, temperature=0.3, store=False, metadata={"who": "me"})
    assert out.output_text == "echo: hi" and out.status == "completed" and out.model == "fake/model"
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens) == (10, 5)
    assert out.instructions == "be brief" and out.max_output_tokens == 50
    sent = backend.bodies[-1]
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (sent["max_completion_tokens"], sent["temperature"]) == (50, 0.3) and "metadata" not in sent
    conversation = client.responses.create(model="task_model", input=[
        {"role": "developer", "content": "terse"},
        {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"role": "user", "content": "second"}])
    assert conversation.output_text == "echo: second"
    assert [(m["role"], m["content"]) for m in backend.bodies[-1]["messages"]] == [
        ("system", "terse"), ("user", "first"), ("assistant", "ok"), ("user", "second")]
    rows = _rows(tmp_path / "run" / "usage.jsonl")
    assert [(r["endpoint"], r["status"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("responses", 200, 10, 5)] * 2
    assert _settled(grant)


@pytest.mark.timing  # the first chunk's time against the last's: alone, not among busy workers
def test_a_streamed_response_arrives_as_events_before_it_ends_and_completes_with_the_usage_charged(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    grant = _granted(gw, tmp_path, backend, budget=Budget(tokens=100_000))
    client = _client(gw, grant.token)
    # A first stream pays the client's one-time costs (its lazy imports, the connection): 0.4 s of them
    # once made the first word of the timed stream look late.
    assert len(list(client.responses.create(model="task_model", input="warm up", stream=True))) > 4
    start = time.perf_counter()
    events = [(time.perf_counter() - start, e) for e in client.responses.create(
        model="task_model", input="go", stream=True)]
    kinds = [e.type for _, e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = [(t, e) for t, e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for _, e in deltas) == "".join(WORDS)  # type: ignore[attr-defined]
    first, total = deltas[0][0], events[-1][0]
    print(f"responses stream: first text after {first:.3f} s, completed after {total:.3f} s")
    assert first < total / 3 and total >= (len(WORDS) - 1) * fake.delay_s
    final = events[-1][1].response  # type: ignore[attr-defined]
    assert final.output_text == "".join(WORDS) and final.usage.input_tokens == 7
    assert final.usage.output_tokens == len(WORDS)
    assert fake.bodies[-1]["stream_options"] == {"include_usage": True}
    assert [e.sequence_number for _, e in events] == list(range(len(events)))
    with client.responses.stream(model="task_model", input="again") as stream:  # the SDK's own accumulator
        assert stream.get_final_response().output_text == "".join(WORDS)
    rows = _rows(tmp_path / "run" / "usage.jsonl")
    assert [(r["endpoint"], r["status"], r["completion_tokens"]) for r in rows] == [
        ("responses", 200, len(WORDS))] * 3
    assert _settled(grant)


def test_function_tools_go_out_as_chat_tools_and_their_calls_come_back_as_items_whole_and_streamed(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    fake, backend = upstream
    fake.delay_s = 0.01
    client = _client(gw, _granted(gw, tmp_path, backend).token)
    out = client.responses.create(model="task_model", input="add one", tools=[ADD],  # type: ignore[list-item]
                                  tool_choice={"type": "function", "name": "add"})
    (call,) = out.output
    assert call.type == "function_call" and (call.name, call.call_id) == ("add", "call_1")
    assert json.loads(call.arguments) == {"a": 1}
    sent = fake.bodies[-1]
    assert sent["tools"] == [{"type": "function", "function": {k: v for k, v in ADD.items() if k != "type"}}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    events = list(client.responses.create(model="task_model", input="add", tools=[ADD], stream=True))  # type: ignore[list-item]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
    assert "".join(pieces) == '{"a": 1}'
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "function_call" and final.output[0].arguments == '{"a": 1}'
    client.responses.create(model="task_model", tools=[ADD], input=[  # type: ignore[list-item]
        {"role": "user", "content": "add one"},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1}', "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "2"}])
    messages = fake.bodies[-1]["messages"]
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "2"}


def test_what_a_stateless_gateway_cannot_serve_is_a_400_naming_it(gw: Gateway, tmp_path: Path,
                                                                   backend: FakeBackend) -> None:
    client = _client(gw, _granted(gw, tmp_path, backend).token)
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]
    for extra, words in (({"previous_response_id": "resp_1"}, "keeps no responses"),
                         ({"store": True}, "'store: true' is not served"),
                         ({"background": True}, "background responses"),
                         ({"tools": [{"type": "web_search"}]}, "tools of type 'web_search'"),
                         ({"input": image}, "'input_image'"),
                         ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning summaries"),
                         ({"truncation": "auto"}, "truncation 'auto'"),
                         ({"include": ["file_search_call.results"]}, "include ['file_search_call.results']"),
                         ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
                         ({"extra_body": {"frobnicate": 1}}, "unsupported parameter(s) for the Responses API "
                                                             "through the gateway: frobnicate")):
        kwargs: dict[str, Any] = {"model": "task_model", "input": "hi", **extra}
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**kwargs)
        assert words in e.value.message, e.value.message
    with pytest.raises(openai.NotFoundError, match="keeps no responses"):
        client.responses.retrieve("resp_1")
    assert backend.bodies == []


def test_inspects_own_openai_provider_speaks_the_responses_api_to_the_gateway(
        gw: Gateway, tmp_path: Path, upstream: tuple[SlowUpstream, OpenAICompatibleBackend]) -> None:
    """GPT-5 models go through the Responses API in Inspect's `openai/` provider: a role named like one
    (the model a run was granted) is reached with nothing but the gateway's URL and the run's token."""
    from inspect_ai.model import get_model

    fake, backend = upstream
    fake.delay_s = 0.01
    grant = _granted(gw, tmp_path, backend, role="gpt-5-mini", budget=Budget(tokens=100_000))

    async def ask(**model_args: Any) -> Any:
        model = get_model("openai/gpt-5-mini", base_url=gw.base_url, api_key=grant.token, memoize=False,
                          **model_args)
        return await model.generate("Say hi")

    whole = asyncio.run(ask())
    assert whole.completion == "".join(WORDS) and whole.error is None
    assert whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (7, len(WORDS))
    streamed = asyncio.run(ask(streaming=True))
    assert streamed.completion == "".join(WORDS)
    assert all(not b.get("stream") for b in fake.bodies[:1]) and fake.bodies[-1]["stream"] is True
    rows = [(r["endpoint"], r["status"]) for r in _rows(tmp_path / "run" / "usage.jsonl")]
    # Inspect first probes for reasoning summaries (refused: it then asks for none), then asks.
    assert rows.count(("responses", 200)) == 2 and set(rows) <= {("responses", 200), ("responses", 400)}
    assert _settled(grant)
