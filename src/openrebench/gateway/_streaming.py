"""Streamed answers (`stream: true`): server-sent events in, server-sent events out, metered at the end.

A backend that streams (an OpenAI-compatible server: llama.cpp gives one event a token) yields OpenAI
chunks as they come, and the gateway passes each on at once, so a client reads the first tokens while
the rest are written. A backend that does not (Inspect's providers) answers whole, and its answer goes
out as the same chunks, all at the end (`whole_as_chunks`). Either way the gateway meters the stream
once it ends (`StreamMeter`): the usage the backend reported (the gateway asks upstream for it with
`stream_options.include_usage`), else the bytes of what was streamed, a bound on its tokens. The client
sees the gateway's own usage chunk, the tokens it was charged, when it asked for one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol

from ._limits import json_bytes

Body = dict[str, Any]
MAX_EVENT = 16 << 20  # bytes of one upstream event: a whole answer in one event fits many times over


class StreamFormatError(Exception):
    """The upstream's stream is not server-sent events of JSON (or one event is past `MAX_EVENT`)."""


def event(data: object, name: str | None = None) -> bytes:
    """One server-sent event: `data: JSON` (after `event: NAME`, as the Responses API names its events)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


async def sse_data(pieces: AsyncIterable[bytes], max_event: int = MAX_EVENT) -> AsyncIterator[str]:
    """The `data` of each server-sent event in a byte stream (lines joined by newlines, as the standard
    says); comments, `event:`, `id:` and `retry:` fields are skipped. Read as the bytes come, whatever
    their split, so that an event is passed on as soon as its blank line arrives."""
    partial: list[bytes] = []  # the line being read, in pieces (joined once whole: no quadratic copying)
    pending = held = 0  # bytes of that line, and of the event's data lines so far
    data: list[str] = []
    async for piece in pieces:
        *lines, rest = piece.split(b"\n")
        if lines:
            lines[0] = b"".join([*partial, lines[0]])
            partial, pending = [], 0
        partial.append(rest)
        pending += len(rest)
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                if data:
                    yield "\n".join(data)
                    data, held = [], 0
            elif line.startswith(b"data:"):
                held += len(line)
                if held > max_event:
                    break
                data.append(line[5:].removeprefix(b" ").decode("utf-8", "replace"))
        if pending + held > max_event:
            raise StreamFormatError(f"an event of the upstream's stream is longer than {max_event:,} bytes")
    last = b"".join(partial).rstrip(b"\r")  # a stream that ended without its last newlines
    if last.startswith(b"data:"):
        data.append(last[5:].removeprefix(b" ").decode("utf-8", "replace"))
    if data:
        yield "\n".join(data)


def whole_as_chunks(output: Body, kind: str) -> list[Body]:
    """A whole answer as the chunks of a stream: one with every choice (a chat message as its `delta`,
    tool calls numbered), then its usage, if it has one, in a chunk of no choices."""
    head = {"id": output.get("id") or f"gw-{uuid.uuid4().hex}", "created": output.get("created", 0),
            "model": output.get("model"), "object": "chat.completion.chunk" if kind == "chat" else
            "text_completion"}
    choices = []
    for i, c in enumerate(output.get("choices") or []):
        if not isinstance(c, dict):
            continue
        if kind == "chat":
            message = {k: v for k, v in (c.get("message") or {}).items() if v is not None}
            if message.get("tool_calls"):
                message["tool_calls"] = [{**call, "index": n} for n, call in enumerate(message["tool_calls"])]
            choices.append({"index": c.get("index", i), "delta": message, "logprobs": c.get("logprobs"),
                            "finish_reason": c.get("finish_reason")})
        else:
            choices.append(c)
    chunks: list[Body] = [{**head, "choices": choices}]
    if isinstance(output.get("usage"), dict):
        chunks.append({**head, "choices": [], "usage": output["usage"]})
    return chunks


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class StreamMeter:
    """What a stream cost: the usage its backend reported, or a bound from the bytes it streamed.

    `counts_one_choice`: the backend's usage counts one choice where `n` > 1 was asked (llama.cpp, which
    streams one usage chunk a choice, each counting its own): the completion is then the larger of the
    chunks' sum and the largest chunk once a choice seen."""

    def __init__(self, counts_one_choice: bool = False) -> None:
        self.counts_one_choice = counts_one_choice
        self.usages: list[Body] = []
        self.choices: set[int] = set()
        self.streamed = 0  # bytes of the text and calls streamed, as JSON: a bound on their tokens
        self.finish: str | None = None

    def add(self, chunk: Body) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usages.append(usage)
        for c in chunk.get("choices") or []:
            if not isinstance(c, dict):
                continue
            self.choices.add(c["index"] if isinstance(c.get("index"), int) else 0)
            for key in ("delta", "text"):
                if c.get(key) is not None:
                    self.streamed += json_bytes(c[key])
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]

    def reported(self) -> tuple[int | None, int | None]:
        """Prompt and completion tokens as the backend reported them (None: it did not)."""
        prompts = [_count(u.get("prompt_tokens")) for u in self.usages]
        completions = [_count(u.get("completion_tokens")) for u in self.usages]
        prompt = None if not prompts or None in prompts else max(p for p in prompts if p is not None)
        counted = [c for c in completions if c is not None]
        if not counted or len(counted) < len(completions):
            return prompt, None
        if self.counts_one_choice:
            return prompt, max(sum(counted), max(counted) * max(1, len(self.choices)))
        return prompt, counted[-1]

    def upstream_usage(self) -> Body:
        """The last usage the backend reported (its details: cached and reasoning tokens), or {}."""
        return self.usages[-1] if self.usages else {}


class Relay(Protocol):
    """Writes a stream for one API: its opening, each backend chunk, and its end (charged usage) or
    failure, as the bytes of server-sent events (empty where there is nothing to send)."""

    def start(self) -> bytes: ...

    def chunk(self, chunk: Body) -> bytes: ...

    def finish(self, prompt: int, completion: int, upstream: Body) -> bytes: ...

    def fail(self, message: str, type: str, code: str | None) -> bytes: ...


class ChatRelay:
    """Chat and text completions: the backend's chunks as they are, the model renamed to the one the
    client knows; the backend's usage held back and the gateway's (what it charged) sent at the end when
    `stream_options.include_usage` asked for it, then `[DONE]`. A failure mid-stream is an event of
    `{"error": ...}`, which OpenAI's clients raise as an APIError."""

    def __init__(self, model: str, kind: str, include_usage: bool) -> None:
        self.model, self.include_usage = model, include_usage
        self.head: Body = {"id": f"gw-{uuid.uuid4().hex}", "created": 0,
                           "object": "chat.completion.chunk" if kind == "chat" else "text_completion"}
        self._seen = False

    def start(self) -> bytes:
        return b""

    def chunk(self, chunk: Body) -> bytes:
        if not self._seen:
            self._seen = True
            self.head = {"id": chunk.get("id") or self.head["id"], "created": chunk.get("created", 0),
                         "object": chunk.get("object") or self.head["object"]}
        if not chunk.get("choices"):
            return b""  # a usage chunk (the gateway sends its own) or a provider's bookkeeping
        return event({k: v for k, v in chunk.items() if k != "usage"} | {"model": self.model})

    def finish(self, prompt: int, completion: int, upstream: Body) -> bytes:
        if not self.include_usage:
            return DONE
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        return event({**self.head, "model": self.model, "choices": [], "usage": usage}) + DONE

    def fail(self, message: str, type: str, code: str | None) -> bytes:
        return event({"error": {"message": message, "type": type, "param": None, "code": code}})
