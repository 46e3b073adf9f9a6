"""The Responses API (`POST /v1/responses`) served from a backend's chat completions.

Some clients speak only OpenAI's newer API: Inspect's own `openai/` provider for o-series, GPT-5 and
codex models (or any model with `-M responses_api=true`), Codex CLI, the `openai` package's
`client.responses`. The gateway keeps nothing between requests, so it serves the stateless part: a
request becomes one chat completion (instructions and input items as messages, function tools,
sampling settings), budgeted and metered as one, and the answer becomes a `response` (output text,
function calls, usage), whole or as the API's stream of events. What it cannot serve faithfully is a
400 naming it, never dropped: stored responses (`store: true`, `previous_response_id`, `conversation`,
`background`), hosted tools (web search, file search, code interpreter, computer use, MCP), images,
files and audio, reasoning summaries, `truncation: auto`. Reasoning models answer without reasoning
items (chat completions give none), so `include: ["reasoning.encrypted_content"]` asks for nothing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ._backends import BadRequest, Unsupported
from ._streaming import event

Body = dict[str, Any]

# Bookkeeping for the provider (its logs, caches, tiers): the answer is the same without them.
IGNORED = frozenset({"metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                     "service_tier", "stream_options"})
TAKEN = frozenset({"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
                   "tool_choice", "parallel_tool_calls", "text", "reasoning", "store", "stream", "include",
                   "top_logprobs", "truncation", "background"})
STATELESS = ("the gateway keeps no responses: send the whole conversation as `input` (and `store: false`)")
REFUSED = {"previous_response_id": STATELESS, "conversation": STATELESS,
           "prompt": "stored prompt templates are not served by the gateway",
           "max_tool_calls": "hosted tools are not served by the gateway (function tools only)",
           "context_management": "compaction is not served by the gateway"}
INCLUDES = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


@dataclass
class ResponsesRequest:
    """What the answer repeats of the request (a `response` echoes its settings) and whether it asked
    for log-probabilities."""

    settings: Body = field(default_factory=dict)
    logprobs: bool = False


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: object, role: str) -> str | list[Body]:
    """A message's content as chat content: a string, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"the content of a {role} message must be a string or a list of parts")
    parts: list[Body] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        else:
            raise Unsupported(f"content parts of type {kind!r} are not served by the gateway: text only "
                              "(what an image, file or audio part costs has no bound the budget can hold)")
    return parts[0]["text"] if len(parts) == 1 else parts


def _messages(body: Body) -> list[Body]:
    messages: list[Body] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a string or a non-empty list of items")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object")
        kind = item.get("type") or "message"
        if kind == "message":
            role = ROLES.get(str(item.get("role")))
            if role is None:
                raise BadRequest(f"unknown message role {item.get('role')!r} (user, system, developer, "
                                 "assistant)")
            messages.append({"role": role, "content": _text(item.get("content"), role)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name")):
                raise BadRequest("a function_call item needs 'call_id' and 'name'")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": str(item.get("arguments") or "")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one assistant turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise BadRequest("a function_call_output item needs 'call_id'")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output") or "", "tool")})
        else:
            raise Unsupported(f"input items of type {kind!r} are not served by the gateway (messages, "
                              "function_call and function_call_output only)")
    return messages


def _tools(body: Body, chat: Body) -> None:
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list")
        out = []
        for t in tools:
            kind = t.get("type") if isinstance(t, dict) else None
            if kind != "function":
                raise Unsupported(f"tools of type {kind!r} are not served by the gateway: function tools "
                                  "only (hosted tools run at OpenAI, which the gateway's models may not be)")
            if not isinstance(t.get("name"), str):
                raise BadRequest("a function tool needs a 'name'")
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
            out.append({"type": "function", "function": fn})
        chat["tools"] = out
    choice = body.get("tool_choice")
    if choice is None:
        return
    if choice in ("auto", "none", "required"):
        chat["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"),
                                                                                       str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise Unsupported(f"tool_choice {choice!r} is not served by the gateway (auto, none, required or "
                          "one function)")


def _format(body: Body, chat: Body) -> None:
    text = body.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise BadRequest("'text' must be an object")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind != "text":
        raise Unsupported(f"text format {kind!r} is not served by the gateway (text, json_schema, "
                          "json_object)")
    if text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]


def _reasoning(body: Body, chat: Body) -> None:
    reasoning = body.get("reasoning")
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise BadRequest("'reasoning' must be an object")
    for key, value in reasoning.items():
        if value is None:
            continue
        if key == "effort":
            chat["reasoning_effort"] = value
        elif key in ("summary", "generate_summary"):
            raise Unsupported("reasoning summaries are not served by the gateway (it answers through chat "
                              "completions, which give none): leave reasoning.summary out")
        else:
            raise Unsupported(f"reasoning.{key} is not served by the gateway (reasoning.effort only)")


def to_chat(body: Body) -> tuple[Body, ResponsesRequest]:
    """A Responses request as the chat completion that answers it (`stream` kept for the server), and
    what its answer repeats; a 400 for anything the chat completion could not honour."""
    given = {k: v for k, v in body.items() if v is not None}
    for key, why in REFUSED.items():
        if key in given:
            raise Unsupported(f"'{key}' is not served: {why}")
    unknown = sorted(set(given) - TAKEN - IGNORED)
    if unknown:
        raise Unsupported(f"unsupported parameter(s) for the Responses API through the gateway: "
                          f"{', '.join(unknown)}")
    if given.get("store") is True:
        raise Unsupported(f"'store: true' is not served: {STATELESS}")
    if given.get("background") is True:
        raise Unsupported("background responses are not served by the gateway (nothing is kept to poll)")
    if given.get("truncation", "disabled") != "disabled":
        raise Unsupported("truncation 'auto' is not served by the gateway (a prompt past the model's "
                          "context is an error)")
    include = given.get("include") or []
    if not isinstance(include, list) or any(not isinstance(i, str) or i not in INCLUDES for i in include):
        raise Unsupported(f"include {include!r} is not served by the gateway (it serves "
                          f"{', '.join(sorted(INCLUDES))})")
    chat: Body = {"model": body.get("model"), "messages": _messages(given)}
    for key in ("temperature", "top_p", "parallel_tool_calls", "stream"):
        if key in given:
            chat[key] = given[key]
    if "max_output_tokens" in given:
        chat["max_completion_tokens"] = given["max_output_tokens"]
    logprobs = "message.output_text.logprobs" in include or "top_logprobs" in given
    if logprobs:
        chat["logprobs"] = True
        if given.get("top_logprobs"):
            chat["top_logprobs"] = given["top_logprobs"]
    _tools(given, chat)
    _format(given, chat)
    _reasoning(given, chat)
    settings = {"instructions": given.get("instructions"),
                "max_output_tokens": given.get("max_output_tokens"),
                "temperature": given.get("temperature"), "top_p": given.get("top_p"),
                "parallel_tool_calls": given.get("parallel_tool_calls", True),
                "tool_choice": given.get("tool_choice", "auto"), "tools": given.get("tools") or [],
                "text": given.get("text") or {"format": {"type": "text"}},
                "reasoning": given.get("reasoning"), "top_logprobs": given.get("top_logprobs"),
                "metadata": given.get("metadata") or {}, "user": given.get("user")}
    return chat, ResponsesRequest(settings, logprobs)


# -- answers ----------------------------------------------------------------------------------------------

def _usage(prompt: int, completion: int, upstream: Body) -> Body:
    """The tokens charged, in the Responses API's words, with the cached and reasoning tokens the
    backend reported among them."""
    def detail(field: str, key: str) -> int:
        found = upstream.get(field)
        value = found.get(key) if isinstance(found, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    cached = detail("prompt_tokens_details", "cached_tokens")
    reasoning = detail("completion_tokens_details", "reasoning_tokens")
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": min(cached, prompt),
                                                             "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(reasoning, completion)},
            "total_tokens": prompt + completion}


def _logprobs(chat: object) -> list[Body]:
    content = chat.get("content") if isinstance(chat, dict) else None
    out = []
    for lp in content or []:
        if not isinstance(lp, dict) or not isinstance(lp.get("token"), str):
            continue
        top = [{"token": t.get("token"), "logprob": t.get("logprob"),
                "bytes": t.get("bytes") or list(str(t.get("token")).encode())}
               for t in lp.get("top_logprobs") or [] if isinstance(t, dict)]
        out.append({"token": lp["token"], "logprob": lp.get("logprob"),
                    "bytes": lp.get("bytes") or list(lp["token"].encode()), "top_logprobs": top})
    return out


def _status(finish: str | None) -> tuple[str, Body | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(request: ResponsesRequest, *, id: str, created: int, model: str, status: str,
                    output: list[Body], usage: Body | None = None, incomplete: Body | None = None,
                    error: Body | None = None) -> Body:
    return {"id": id, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "usage": usage, "incomplete_details": incomplete, "error": error,
            **request.settings, "truncation": "disabled", "store": False, "background": False,
            "previous_response_id": None}


def from_chat(output: Body, request: ResponsesRequest, model: str, prompt: int, completion: int) -> Body:
    """A whole chat completion as a `response`: a message of its text (if it has text, or no calls), then a
    function_call item a tool call; `incomplete` where it stopped at its token cap."""
    choices = output.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    status, incomplete = _status(choice.get("finish_reason"))
    done = "completed" if status == "completed" else "incomplete"
    items: list[Body] = []
    text, calls = message.get("content"), message.get("tool_calls") or []
    if isinstance(text, list):
        text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
    refusal = message.get("refusal")
    if text or refusal or not calls:
        content: list[Body] = []
        if text or not refusal:
            content.append({"type": "output_text", "text": text or "", "annotations": [],
                            "logprobs": _logprobs(choice.get("logprobs")) if request.logprobs else []})
        if refusal:
            content.append({"type": "refusal", "refusal": refusal})
        items.append({"type": "message", "id": _id("msg"), "status": done, "role": "assistant",
                      "content": content})
    for call in (c for c in calls if isinstance(c, dict)):
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        items.append({"type": "function_call", "id": _id("fc"), "call_id": call.get("id") or _id("call"),
                      "name": fn.get("name", ""), "arguments": fn.get("arguments") or "", "status": done})
    upstream = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    return response_object(request, id=_id("resp"), created=int(output.get("created") or time.time()),
                           model=model, status=status, output=items, incomplete=incomplete,
                           usage=_usage(prompt, completion, upstream))


class ResponsesRelay:
    """A chat stream as the Responses API's events: `response.created`, then for the text a message item
    (`output_item.added`, `content_part.added`, `output_text.delta`s, and their `done`s at the end), for
    each tool call a function_call item (`function_call_arguments.delta`s), and last `response.completed`
    (or `incomplete`) carrying the whole response with the usage charged; `response.failed` on a failure."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request, self.model = request, model
        self.id, self.created, self.sequence = _id("resp"), int(time.time()), 0
        self.items: list[Body] = []
        self.message: Body | None = None  # the open message item: its text part is content[0]
        self.calls: dict[int, Body] = {}  # function_call items by the chat stream's tool-call index
        self.finish_reason: str | None = None

    def _event(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event(data, type_)

    def _response(self, status: str, **fields: Any) -> Body:
        return response_object(self.request, id=self.id, created=self.created, model=self.model,
                               status=status, output=self.items, **fields)

    def start(self) -> bytes:
        return (self._event("response.created", response=self._response("in_progress"))
                + self._event("response.in_progress", response=self._response("in_progress")))

    def _open_message(self) -> bytes:
        self.message = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant",
                        "content": []}
        self.items.append(self.message)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        index = len(self.items) - 1
        added = self._event("response.output_item.added", output_index=index, item=dict(self.message))
        self.message["content"].append(part)
        return added + self._event("response.content_part.added", item_id=self.message["id"],
                                   output_index=index, content_index=0, part=dict(part))

    def _text(self, text: str, logprobs: list[Body]) -> bytes:
        out = b"" if self.message is not None else self._open_message()
        assert self.message is not None
        part = self.message["content"][0]
        part["text"] += text
        part["logprobs"] += logprobs
        return out + self._event("response.output_text.delta", item_id=self.message["id"],
                                 output_index=self.items.index(self.message), content_index=0, delta=text,
                                 logprobs=logprobs)

    def _call(self, delta: Body) -> bytes:
        index = delta.get("index") if isinstance(delta.get("index"), int) else len(self.calls)
        fn = delta.get("function") or {}
        item, out = self.calls.get(index), b""
        if item is None:
            item = {"type": "function_call", "id": _id("fc"), "call_id": delta.get("id") or _id("call"),
                    "name": fn.get("name") or "", "arguments": "", "status": "in_progress"}
            self.calls[index] = item
            self.items.append(item)
            out = self._event("response.output_item.added", output_index=len(self.items) - 1,
                              item=dict(item))
        elif fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self.items.index(item), delta=fn["arguments"])
        return out

    def chunk(self, chunk: Body) -> bytes:
        out = b""
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, list):
                text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
            if text:
                lps = _logprobs(choice.get("logprobs")) if self.request.logprobs else []
                out += self._text(text, lps)
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self, prompt: int, completion: int, upstream: Body) -> bytes:
        out = b"" if self.items else self._open_message()  # an empty answer is an empty message
        status, incomplete = _status(self.finish_reason)
        for index, item in enumerate(self.items):
            item["status"] = "completed" if status == "completed" else "incomplete"
            if item["type"] == "message":
                part = item["content"][0]
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=part["logprobs"])
                out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part)
            else:
                out += self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, name=item["name"], arguments=item["arguments"])
            out += self._event("response.output_item.done", output_index=index, item=item)
        final = self._response(status, usage=_usage(prompt, completion, upstream), incomplete=incomplete)
        return out + self._event(f"response.{status}", response=final)

    def fail(self, message: str, type: str, code: str | None) -> bytes:
        error = {"code": code or "server_error", "message": message}
        return self._event("response.failed", response=self._response("failed", error=error))
