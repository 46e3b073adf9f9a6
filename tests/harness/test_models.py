"""Real models: client checks, limits, the cost estimate, and the react agent against a local
OpenAI-compatible server through Inspect's real `openai-api` provider."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from openrebench.api import OpenRebenchError
from openrebench.cli import app
from openrebench.gateway import LOCAL_INSPECT_MODEL, LocalEndpoint
from openrebench.harness import _models, agent_limits
from openrebench.harness._limits import IDLE_TURNS, parse_count
from openrebench.harness._models import (
    LOCAL_AGENT_SERVER,
    Estimate,
    check_client,
    check_credentials,
    estimate_run,
    find_price,
    install_hint,
    resolve_agent_model,
)
from openrebench.isolation import bwrap_binary

pytest.importorskip("openai")


# --- a local OpenAI-compatible server ------------------------------------------------------------


class _Chat(BaseHTTPRequestHandler):
    """/v1/chat/completions with a script chosen by the model name: `chatty` scores once and then only
    talks, `busy` runs a shell command every turn. Requests are kept for the tests to inspect."""

    requests: ClassVar[list[dict[str, Any]]] = []
    calls: ClassVar[int] = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        type(self).calls += 1
        name, messages = body["model"], body["messages"]
        scored = any(m["role"] == "tool" for m in messages)
        if name == "busy":
            call: tuple[str, dict[str, Any]] | None = ("bash", {"command": "echo hi"})
        elif name == "chatty" and not scored:
            call = ("score", {})
        else:
            call = None
        message: dict[str, Any] = {"role": "assistant", "content": None if call else "Thinking it over."}
        if call:
            message["tool_calls"] = [{"id": f"call_{self.calls}", "type": "function",
                                      "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
        finish = "tool_calls" if call else "stop"
        usage = {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
        if body.get("stream"):
            self._stream(name, message, finish, usage)
            return
        self._send("application/json", json.dumps({
            "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0, "model": name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}).encode())

    def _stream(self, name: str, message: dict[str, Any], finish: str, usage: dict[str, int]) -> None:
        delta = {k: v for k, v in message.items() if v is not None}
        for i, call in enumerate(delta.get("tool_calls", [])):
            call["index"] = i
        chunk = {"id": f"chatcmpl-{self.calls}", "object": "chat.completion.chunk", "created": 0,
                 "model": name}
        events = [{**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                  {**chunk, "choices": [], "usage": usage}]
        self._send("text/event-stream", b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
                   + b"data: [DONE]\n\n")

    def _send(self, kind: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.fixture
def local_model(server: str, monkeypatch: pytest.MonkeyPatch) -> type[_Chat]:
    from openrebench.cli import _common

    monkeypatch.setattr(_common.console, "width", 250)  # the whole results table on one line per row
    monkeypatch.setenv("LOCAL_BASE_URL", server)
    monkeypatch.setenv("LOCAL_API_KEY", "unused")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    _Chat.requests = []
    return _Chat


def _eval(tmp_path: Path, model: str, *extra: str) -> Any:
    from inspect_ai.log import list_eval_logs, read_eval_log

    isolation = "auto" if bwrap_binary() else "none"
    # The example plug-in: its scorings take a second, and nothing here is about what is scored.
    result = CliRunner().invoke(app, ["eval", "example_fit", "--tier", "mini", "--agent", "react",
                                      "--model", model, "--time-limit", "60s", "--isolation", isolation,
                                      "--display", "none", "--log-dir", str(tmp_path / "logs"),
                                      "--runs-dir", str(tmp_path / "runs"), *extra],
                                terminal_width=250)
    assert result.exit_code == 0, result.output
    (info,) = list_eval_logs(str(tmp_path / "logs"))
    return result.output, read_eval_log(info)


@pytest.mark.slow
@pytest.mark.timing  # one minute of working time must hold a scoring and the turns around it
def test_react_scores_through_the_real_provider_then_stops_when_it_only_talks(
        tmp_path: Path, local_model: type[_Chat]) -> None:
    output, log = _eval(tmp_path, "openai-api/local/chatty")
    assert "the price of openai-api/local/chatty is unknown" in output
    assert "200k tokens at most" in output  # 60 s of working time: the minimum token limit
    (sample,) = log.samples
    (result,) = [m for m in sample.messages if m.role == "tool"]
    assert result.function == "score" and "working time used" in result.text, result.text
    rows = sample.scores["rebench_scorer"].metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score"]
    # one turn with the tool call, then IDLE_TURNS turns without one; the model was urged between them
    assert len(local_model.requests) == 1 + IDLE_TURNS
    assert "without a tool call (2 left)" in json.dumps(local_model.requests[-1]["messages"])
    assert {t["function"]["name"] for t in local_model.requests[0]["tools"]} >= {"score", "bash", "submit"}
    assert sample.limit is None and sample.store["openrebench:idle_stop"] == IDLE_TURNS
    assert log.eval.metadata["message_limit"] == 40 and log.eval.metadata["token_limit"] == 200_000
    assert f"{IDLE_TURNS} turns without a tool" in output
    assert "per attempt: 1 min working time, 40 messages, 200k tokens, stop after 3 turns" in output


@pytest.mark.slow
def test_the_message_limit_ends_a_busy_attempt(tmp_path: Path, local_model: type[_Chat]) -> None:
    output, log = _eval(tmp_path, "openai-api/local/busy", "--message-limit", "8", "--token-limit", "1M")
    (sample,) = log.samples
    assert sample.limit is not None and sample.limit.type == "message"
    assert len(sample.messages) == 8
    assert all(len(r["messages"]) < 8 for r in local_model.requests)
    assert "message limit (8)" in output and "8 messages, 1M tokens" in output
    assert "1M tokens at most" in output
    assert log.eval.metadata["message_limit"] == 8 and log.eval.metadata["token_limit"] == 1_000_000


def test_the_provider_streams_tool_calls_from_the_server(local_model: type[_Chat]) -> None:
    import asyncio

    from inspect_ai.model import ChatMessageUser, get_model
    from inspect_ai.tool import ToolInfo, ToolParams

    model = get_model("openai-api/local/chatty", stream=True)
    tool = ToolInfo(name="score", description="Score the solution.", parameters=ToolParams())
    out = asyncio.run(model.generate([ChatMessageUser(content="go")], tools=[tool]))
    assert local_model.requests[-1]["stream"] is True
    assert [c.function for c in out.message.tool_calls or []] == ["score"]
    assert out.usage is not None and out.usage.input_tokens == 1000


# --- clients --------------------------------------------------------------------------------------


def test_a_missing_client_is_one_line_naming_the_extra_before_any_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = ("openrebench_no_such_client", "anthropic", "2.0.0", "the Anthropic client", "anthropic")
    monkeypatch.setitem(_models.CLIENTS, "anthropic", missing)
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--agent", "react", "--model",
                                      "anthropic/claude-sonnet-4-5", "--runs-dir", str(tmp_path / "runs"),
                                      "--log-dir", str(tmp_path / "logs")], terminal_width=300)
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: the model anthropic/claude-sonnet-4-5 needs the Anthropic client: ")
    assert "[anthropic]" in line and "pip install" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()


def test_a_missing_api_key_is_one_line_before_any_run(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "AZUREAI_OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--agent", "react", "--model",
                                      "openai/gpt-4o", "--runs-dir", str(tmp_path / "runs"),
                                      "--log-dir", str(tmp_path / "logs")], terminal_width=300)
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]  # after the estimate
    assert line.startswith("error: the model openai/gpt-4o cannot be used here: ")
    assert "OPENAI_API_KEY" in line
    assert "[bold]" not in line and not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()


def test_a_client_older_than_inspect_accepts_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_models.CLIENTS, "openai", ("openai", "openai", "999.0.0", "the OpenAI client",
                                                    "openai"))
    with pytest.raises(OpenRebenchError, match=r"needs openai >= 999\.0\.0 \(found \d"):
        check_client("openai/gpt-4o")
    check_client("mockllm/model")  # no client needed


def test_install_hint_is_an_editable_install_in_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(_models.__file__).resolve().parents[3]
    monkeypatch.chdir(root)
    assert install_hint("openai").endswith(" -m pip install -e '.[openai]'")


# --- the offline default model -------------------------------------------------------------------


def test_local_names_the_offline_model_free_but_priced_and_checked_offline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_BASE_URL", raising=False)
    name, serving = resolve_agent_model("local")
    assert name == LOCAL_INSPECT_MODEL == "openai-api/local/gemma-3-270m"
    assert not isinstance(serving, contextlib.nullcontext)  # a server to start, once entered
    assert not isinstance(resolve_agent_model(name)[1], contextlib.nullcontext)  # its own name, no URL
    assert isinstance(resolve_agent_model("openai/gpt-4o")[1], contextlib.nullcontext)
    assert resolve_agent_model(None)[0] is None
    for model in ("local", name):
        assert find_price(model) == ({"input": 0.0, "output": 0.0}, "runs locally")
    assert find_price(name, {name: {"input": 1, "output": 1}})[1] == "from --prices"
    check_credentials(name)  # no key, no server yet: nothing to check
    est = estimate_run(name, ["optimize_kernel"], "mini", 60, 1, None, None, None, agent="react")
    assert est.bound == 0 and f"{name} runs locally (no per-token price)" in "\n".join(est.lines())
    monkeypatch.setitem(_models.CLIENTS, "openai-api", ("openrebench_no_such_client", "openai", "3.4.0",
                                                        "the OpenAI client", "openai"))
    with pytest.raises(OpenRebenchError, match=r"the model openai-api/local/gemma-3-270m needs the OpenAI "):
        check_client("local")
    monkeypatch.setenv("LOCAL_BASE_URL", "http://127.0.0.1:9/v1")  # a server of the user's own
    assert isinstance(resolve_agent_model(name)[1], contextlib.nullcontext)


def test_the_agents_server_never_cuts_a_tiers_own_replies_shorter_than_its_cap() -> None:
    """The shared offline server caps every reply at what its first user asked: where the agent's eval
    started it, the environments' scorings get that cap too, so it is no lower than any tier's own cap on
    the offline model (rust_codecontests' reference asks 150 tokens under the mini tier's 160)."""
    from openrebench.api import LOCAL_MODEL
    from openrebench.runs import environment_classes, get_environment

    caps = []
    for env_id in environment_classes():
        for spec in get_environment(env_id).tiers.values():
            if any(role.model == LOCAL_MODEL for role in spec.models.values()):
                caps += [b.reply_tokens for b in (spec.model_budget, spec.scoring_model_budget)
                         if b is not None and b.reply_tokens is not None]
    assert caps, "no tier caps the offline model's replies: the check would check nothing"
    assert max(caps) <= LOCAL_AGENT_SERVER["max_tokens"], (caps, LOCAL_AGENT_SERVER)


def test_serving_points_inspects_provider_at_the_shared_server_and_restores_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_ai.model import get_model_info
    from inspect_ai.model._model_info import clear_model_info_cache

    entered: list[str] = []

    @contextlib.contextmanager
    def fake_server(**options: Any) -> Iterator[LocalEndpoint]:
        assert options["max_tokens"] == LOCAL_AGENT_SERVER["max_tokens"]  # short enough for a minute
        entered.append("in")
        yield LocalEndpoint("http://127.0.0.1:1/v1", "secret")
        entered.append("out")

    monkeypatch.setattr(_models, "shared_local_server", fake_server)
    monkeypatch.delenv("LOCAL_BASE_URL", raising=False)
    monkeypatch.setenv("LOCAL_API_KEY", "the user's")
    name, serving = resolve_agent_model("local")
    assert entered == []  # nothing starts before the eval
    try:
        with serving:
            assert (os.environ["LOCAL_BASE_URL"], os.environ["LOCAL_API_KEY"]) == ("http://127.0.0.1:1/v1",
                                                                                   "secret")
            info = get_model_info(name)
            assert info is not None and info.cost is not None and info.cost.output == 0  # the log gets $0
        assert entered == ["in", "out"]
        assert "LOCAL_BASE_URL" not in os.environ and os.environ["LOCAL_API_KEY"] == "the user's"
    finally:
        clear_model_info_cache()


# --- limits and the cost estimate -----------------------------------------------------------------


def test_react_limits_scale_with_the_working_time_and_others_get_only_explicit_ones() -> None:
    assert agent_limits("react", 2 * 3600).messages == 600
    assert agent_limits("react", 8 * 3600).tokens == 16_000_000
    assert agent_limits("react", 60) == agent_limits("react", 120)  # both at the minimums
    assert agent_limits("react", 3600, "50", "500k").messages == 50
    assert agent_limits("react", 3600, "50", "500k").tokens == 500_000
    assert agent_limits("oracle", 3600).messages is None and agent_limits("human", 3600).tokens is None
    assert agent_limits("oracle", 3600, 9).messages == 9
    assert parse_count("2.5M", "x") == 2_500_000 and parse_count(7, "x") == 7
    for bad in ("lots", "0", "-3"):
        with pytest.raises(OpenRebenchError, match="bad token limit"):
            parse_count(bad, "token limit")


def test_the_idle_count_restarts_after_each_tool_call() -> None:
    import asyncio

    from inspect_ai.agent import AgentState
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ChatMessageUser, ModelOutput
    from inspect_ai.tool import ToolCall

    from openrebench.harness._limits import stop_when_idle

    def call(i: int) -> ChatMessageAssistant:
        return ChatMessageAssistant(content="", tool_calls=[ToolCall(id=f"c{i}", function="score",
                                                                     arguments={})])

    talk = ChatMessageAssistant(content="hmm")
    go = ChatMessageUser(content="continue")
    messages = [go, call(1), ChatMessageTool(content="ok", tool_call_id="c1"), talk, go, talk, go, call(2),
                ChatMessageTool(content="ok", tool_call_id="c2"), talk]
    state = AgentState(messages=messages)
    state.output = ModelOutput.from_content("m", "hmm")
    assert "(2 left)" in asyncio.run(stop_when_idle(3)(state))  # two talks before the last call don't count
    state.output = ModelOutput.for_tool_call("m", "score", {})
    assert asyncio.run(stop_when_idle(3)(state)) is True


def test_task_args_set_inspect_limits_and_metadata() -> None:
    from openrebench.harness import environment_tasks

    make = environment_tasks()["optimize_kernel"]
    task = make(agent="react", time_limit=600, message_limit="70", token_limit="300k")
    assert (task.message_limit, task.token_limit) == (70, 300_000)
    assert task.metadata["idle_turns"] == IDLE_TURNS
    oracle = environment_tasks()["optimize_kernel"]()
    assert oracle.message_limit is None and oracle.metadata["token_limit"] is None


def test_prices_come_from_the_file_inspect_the_table_or_nowhere(tmp_path: Path) -> None:
    from inspect_ai.model import ModelCost, set_model_cost
    from inspect_ai.model._model_info import clear_model_info_cache

    assert find_price("openai/gpt-4o")[0] == {"input": 2.5, "output": 10.0}
    assert find_price("anthropic/claude-sonnet-4-5-20250929")[0] == {"input": 3.0, "output": 15.0}
    assert find_price("openai/gpt-4o-2024-05-13")[0] == {"input": 5.0, "output": 15.0}
    assert find_price("openai/gpt-4o", {"openai/gpt-4o": {"input": 1, "output": 2}}) == (
        {"input": 1, "output": 2}, "from --prices")
    assert find_price("ollama/llama3.1")[1] == "runs locally"
    assert find_price("openai-api/local/mystery") == (None, "unknown")
    set_model_cost("openai/gpt-4.1", ModelCost(input=7, output=9, input_cache_write=7, input_cache_read=1))
    try:
        assert find_price("openai/gpt-4.1") == ({"input": 7, "output": 9}, "from Inspect's model data")
    finally:
        clear_model_info_cache()


def test_the_estimate_bounds_every_attempt_at_the_dearer_price_and_stops_above_max_cost(
        tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai/my-model": {"input": 1.0, "output": 4.0}}))
    est = estimate_run("openai/my-model", ["optimize_kernel", "fix_embedding"], "mini", 1800, 3, None, None,
                       prices, agent="react")
    assert est.attempts == 6 and est.tokens == 6 * 1_000_000
    assert est.bound == pytest.approx(24.0)
    text = "\n".join(est.lines())
    assert "at most $24.00" in text and "about $6.00" in text and "at most 3 h in all" in text
    est.check(max_cost=24.0, yes=False)
    with pytest.raises(OpenRebenchError, match=r"cost bound \$24\.00 is above --max-cost \$10\.00"):
        est.check(max_cost=10.0, yes=False)
    est.check(max_cost=10.0, yes=True)
    unknown = Estimate("openai-api/x/y", 1, 1, est.limits[:1], [1800], None, "unknown")
    assert unknown.bound is None and "price of openai-api/x/y is unknown" in "\n".join(unknown.lines())


def test_eval_stops_above_max_cost_with_one_line_before_any_run(tmp_path: Path) -> None:
    args = ["eval", "optimize_kernel", "--runs-dir", str(tmp_path / "runs"), "--log-dir", str(tmp_path / "l")]
    result = CliRunner().invoke(app, [*args, "--agent", "react", "--model", "openai/gpt-4o", "--epochs", "5"],
                                terminal_width=300)
    assert result.exit_code == 1, result.output
    assert "at most $200.00" in result.output  # 5 × 4M tokens (2 h) × $10 per 1M output tokens
    assert result.output.strip().splitlines()[-1].startswith("error: the cost bound $200.00 is above")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--token-limit", "lots"), "error: bad token limit 'lots' (use a number, e.g. 400, 500k or 2M)"),
    (("--message-limit", "0"), "error: bad message limit '0' (must be at least 1)"),
    (("--prices", "MISSING"), "does not exist"),
])
def test_bad_limits_and_prices_are_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    args = tuple(str(tmp_path / a) if a == "MISSING" else a for a in args)
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--agent", "react", "--model",
                                      "openai/gpt-4o", "--runs-dir", str(tmp_path / "runs"), *args],
                                terminal_width=300)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [result.output.strip()] and message in result.output
    assert not (tmp_path / "runs").exists()
