"""`InspectBackend`: any model Inspect can call, behind the gateway.

The client's OpenAI chat request becomes Inspect's messages, tools and `GenerateConfig`; Inspect's
output becomes an OpenAI chat completion. A parameter Inspect has no setting for is refused, never
dropped (`check`). Streamed requests stream as the provider does, through Inspect's `on_stream`
(`stream`): OpenAI, Anthropic, Google and OpenAI-compatible providers write their text as it comes;
the tool calls, finish reason and usage follow whole, from the final output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ._backends import BackendError, BackendUnavailable, BadRequest, Body, Unsupported, redact
from ._streaming import whole_as_chunks

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


# Chat parameters an Inspect model takes (`InspectBackend._config`, `_tools`), and those that leave the
# answer as it is (the provider's own bookkeeping), taken and dropped: any other is refused.
CHAT_TAKEN = frozenset({"model", "messages", "n", "temperature", "max_tokens", "max_completion_tokens",
                        "stop", "top_p", "seed", "frequency_penalty", "presence_penalty", "logprobs",
                        "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "reasoning_effort",
                        "verbosity", "logit_bias", "response_format", "top_k"})
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                      "prompt_cache_retention", "safety_identifier"})


def _logit_bias(value: object) -> dict[int, float] | None:
    if value is None:
        return None
    try:
        return {int(k): float(v) for k, v in value.items()}  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        raise BadRequest("'logit_bias' must map token ids to numbers") from None


def _response_schema(value: object) -> Any:
    """OpenAI's `response_format` as Inspect's response schema (json_schema), or None (text)."""
    if value is None or (isinstance(value, dict) and value.get("type") == "text"):
        return None
    from inspect_ai.model import ResponseSchema
    from inspect_ai.util import JSONSchema

    json_schema = isinstance(value, dict) and value.get("type") == "json_schema"
    spec = value.get("json_schema") if json_schema else None  # type: ignore[union-attr]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise Unsupported("response_format is taken as json_schema (with a name) or text through Inspect's "
                          "providers")
    try:
        schema = JSONSchema.model_validate(spec.get("schema") or {})
        return ResponseSchema(name=spec["name"], json_schema=schema, description=spec.get("description"),
                              strict=spec.get("strict"))
    except ValueError as e:
        raise BadRequest(f"invalid json_schema: {str(e).splitlines()[0]}") from None


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

    def check(self, kind: str, body: Body) -> None:
        """Refuse what Inspect's generate has no setting for: dropped, it would change the answer unseen."""
        if kind != "chat":
            return  # `complete` refuses every request
        unknown = sorted(k for k, v in body.items() if v is not None and k not in CHAT_TAKEN | HARMLESS)
        if unknown:
            raise Unsupported(f"the model {self.name} does not take {', '.join(unknown)} through the gateway "
                              "(Inspect's provider has no such setting)")

    @staticmethod
    def _config(body: Body) -> Any:
        from inspect_ai.model import GenerateConfig

        stop = body.get("stop")
        top = body.get("top_logprobs")
        fields = {
            "num_choices": body.get("n"), "temperature": body.get("temperature"),
            "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
            "stop_seqs": [stop] if isinstance(stop, str) else stop, "top_p": body.get("top_p"),
            "seed": body.get("seed"), "top_k": body.get("top_k"),
            "frequency_penalty": body.get("frequency_penalty"),
            "presence_penalty": body.get("presence_penalty"),
            "logprobs": bool(body.get("logprobs")) or None, "top_logprobs": top or None,
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "reasoning_effort": body.get("reasoning_effort"), "verbosity": body.get("verbosity"),
            "logit_bias": _logit_bias(body.get("logit_bias")),
            "response_schema": _response_schema(body.get("response_format")),
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

    async def _generate(self, body: Body, on_stream: Any = None) -> Any:
        """Inspect's output for the request (its provider's failures as the gateway's errors)."""
        messages, config = self._messages(body), self._config(body)
        tools, choice = self._tools(body)
        model = self._get()
        try:
            output = await model.generate(messages, tools=tools, tool_choice=choice if tools else None,
                                          config=config, on_stream=on_stream)
        except ConnectionError as e:
            raise BackendUnavailable(f"the model {self.name} cannot be reached ({type(e).__name__})") from e
        except BackendError:
            raise
        except Exception as e:
            detail = redact(str(e).splitlines()[0] if str(e) else "", self._spec[1])[:300]
            raise BackendError(f"the model {self.name} failed: {type(e).__name__}: {detail}") from e
        if output.error:
            raise BackendError(f"the model {self.name} failed: {redact(output.error, self._spec[1])[:300]}")
        return output

    def _answer(self, output: Any) -> Body:
        """Inspect's output as an OpenAI chat completion."""
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

    async def chat(self, body: Body) -> Body:
        return self._answer(await self._generate(body))

    async def stream(self, kind: str, body: Body) -> AsyncIterator[Body]:
        """The answer's text as the provider streams it (Inspect's `on_stream`; a provider that does not
        stream gives it all at the end), then the rest whole from the final output: any text the
        stream missed, the tool calls, the finish reason and the usage. Several choices come whole.
        A provider that starts again after text was sent (Inspect's retry) fails the stream: what the
        client read cannot be taken back."""
        if kind != "chat" or (body.get("n") or 1) > 1:
            for chunk in whole_as_chunks(await (self.chat if kind == "chat" else self.complete)(body), kind):
                yield chunk
            return
        events: asyncio.Queue[Any] = asyncio.Queue()

        async def on_stream(event: Any) -> None:
            events.put_nowait(event)

        generating = asyncio.ensure_future(self._generate(body, on_stream))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.name}
        sent = ""
        try:
            while not (generating.done() and events.empty()):
                if events.empty():
                    waiting = asyncio.ensure_future(events.get())
                    await asyncio.wait({waiting, generating}, return_when=asyncio.FIRST_COMPLETED)
                    if not waiting.done():
                        waiting.cancel()
                        continue
                    event = waiting.result()
                else:
                    event = events.get_nowait()
                if event.type == "retry" and sent:
                    raise BackendError(f"the model {self.name} started its answer again after part of it "
                                       "was streamed")
                if event.type == "text" and event.text:
                    sent += event.text
                    yield {**head, "choices": [{"index": 0, "delta": {"content": event.text},
                                                "finish_reason": None}]}
            answer = self._answer(generating.result())
        finally:
            if not generating.done():
                generating.cancel()
                with contextlib.suppress(BaseException):
                    await generating
        (choice,) = answer["choices"]
        message, delta = choice["message"], {}
        text = message.get("content") or ""
        if not text.startswith(sent):
            raise BackendError(f"the model {self.name} answered otherwise than it streamed")
        if text[len(sent):]:
            delta["content"] = text[len(sent):]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{**call, "index": n} for n, call in enumerate(message["tool_calls"])]
        yield {**head, "choices": [{"index": 0, "delta": delta, "logprobs": choice.get("logprobs"),
                                    "finish_reason": choice.get("finish_reason")}]}
        if "usage" in answer:
            yield {**head, "choices": [], "usage": answer["usage"]}

    async def complete(self, body: Body) -> Body:
        raise Unsupported(f"the model {self.name} has no text completions endpoint through Inspect "
                          "(use /v1/chat/completions)")
