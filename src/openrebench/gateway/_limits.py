"""What one request may hold of a budget: a bound on its prompt's tokens, its completion caps and
choices, checked before it reaches a model; and the refusal the gateway answers with when it does not
fit (status, OpenAI error type and code, and the limit in words)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_CHOICES = 16  # `n` of one request: each choice is charged, and held against the budget meanwhile
CAP_UNASKED = 4096  # completion tokens per choice for a request that names no `max_tokens`, under a budget:
# imposed as its `max_tokens` and held (less where less remains; any model takes a cap this small)

# The prompt's bound (`prompt_bound`). Byte-level BPE tokenizers (GPT-2, tiktoken, Llama 3) and
# SentencePiece with byte fallback (Gemma, the offline model) never make a token of less than one UTF-8
# byte, so the bytes of the text bound its tokens, whatever the text (multibyte characters, rare
# scripts, random bytes), and the bytes of a structure written as JSON (tools, tool calls) bound it
# rendered as JSON; the constants bound what a provider adds around them: chat-template tokens of one
# message (role header and separators: 3 to 5 in ChatML, Llama 3, Gemma, OpenAI's count), of one request
# (BOS, the assistant's header, Llama 3.1's default system header: about 30), and a tool-use preamble
# (Anthropic documents 264 to 346 tokens).
PROMPT_TOKENS_PER_MESSAGE = 8
PROMPT_TOKENS_PER_REQUEST = 64
PROMPT_TOKENS_FOR_TOOLS = 512


class Refusal(Exception):
    """A request the gateway answers itself with an error: OpenAI's status, error type and code."""

    def __init__(self, status: int, message: str, type: str, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.headers = dict(headers or {})


def json_bytes(value: object) -> int:
    """Bytes of a JSON value written compactly, strings unescaped (UTF-8): at least the bytes of every
    string in it and of the structure around them (a walk without recursion: the body may nest as deep
    as the JSON parser allowed)."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += 2 + len(v.encode("utf-8", "surrogatepass"))  # JSON may carry lone surrogates
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)  # braces, a colon and a comma an entry
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            total += 2 + len(v)
            stack.extend(v)
        else:
            total += len(json.dumps(v))  # numbers, true, false, null
    return total


def prompt_bound(endpoint: str, body: dict[str, Any]) -> int:
    """An upper bound on the request's prompt tokens that the gateway computes offline, for any model
    whose tokens cover at least one byte (see PROMPT_TOKENS_PER_MESSAGE): the bytes of the request as
    JSON (every message's text with its fields, tools, and any field a backend might render), plus the
    template's tokens per message (per prompt of a text completion: its BOS), per request and for tools.
    A text completion's prompt given as token ids counts one a token. Content parts other than text
    (images, audio) cost what the provider decides: refused."""
    total, rest = PROMPT_TOKENS_PER_REQUEST, dict(body)
    if endpoint == "chat":
        messages = rest.pop("messages", None)
        messages = messages if isinstance(messages, list) else [messages]
        for m in messages:
            parts = m.get("content") if isinstance(m, dict) else None
            if isinstance(parts, list) and any(not isinstance(p, dict) or p.get("type") != "text"
                                               for p in parts):
                raise Refusal(400, "only text content parts are supported through the gateway (what an "
                              "image or audio part costs has no bound the budget can hold)",
                              "invalid_request_error", "unsupported_content")
            total += PROMPT_TOKENS_PER_MESSAGE + json_bytes(m)
    else:
        prompt = rest.pop("prompt", None)
        ids = isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)
        prompts = prompt if isinstance(prompt, list) and not ids else [prompt]
        for p in prompts:
            ids = isinstance(p, list) and all(isinstance(t, int) for t in p)
            total += PROMPT_TOKENS_PER_MESSAGE + (len(p) if ids else json_bytes(p))
    if rest.get("tools") or rest.get("functions"):
        total += PROMPT_TOKENS_FOR_TOOLS
    return total + json_bytes(rest)


def positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refusal(400, f"'{key}' must be a positive integer, not {json.dumps(value)[:40]}",
                      "invalid_request_error", "invalid_value")
    return value


def limit(body: dict[str, Any], room: int | None, prompt: int, budget: str, *,
          max_choices: int | None = None, model: str = "this model", reply_cap: int | None = None) -> int:
    """Check `n` and the completion caps, cap the completion at the budget's `room` (completion tokens
    left once the prompt's bound is taken off; None: no limit) shared among the choices, and give the
    completion tokens the request holds while in flight. Under a budget the cap is always imposed (as
    `max_tokens`, `CAP_UNASKED` when none was asked), so that nothing past it can be written; so is
    `reply_cap` (the budget's most tokens of one reply), budget or not.
    `max_choices`: the most choices the model's backend gives in one request (llama.cpp: its slots).
    Each refusal names the limit it met, so that a client can ask again within it."""
    for key in ("n_predict", "best_of"):  # llama.cpp's own cap, vLLM's hidden choices: neither metered
        if body.get(key) is not None and body.get(key) != 1:
            raise Refusal(400, f"'{key}' is not supported by the gateway (use max_tokens and n)",
                          "invalid_request_error", "unsupported_parameter")
    if "chat_template" in body:  # vLLM's template of the request's own: a program that can repeat the text
        raise Refusal(400, "'chat_template' is not supported by the gateway (its prompt could not be "
                      "bounded)", "invalid_request_error", "unsupported_parameter")
    n = asked_n = positive_int(body, "n") or 1
    prompts = body.get("prompt")  # text completions take a batch of prompts: `n` choices each
    batch = ""
    if isinstance(prompts, list) and prompts and all(isinstance(p, str | list) for p in prompts):
        n *= len(prompts)
        batch = f" for each of {len(prompts)} prompts ({n} choices)"
    echo = body.get("echo") is True and body.get("max_tokens") == 0  # the prompt's log-probabilities alone
    # An echo generates nothing: the backend's slots (its generations at once) do not bound it.
    slots = None if echo else max_choices
    for most, whose in ((MAX_CHOICES, "the gateway"), (slots, f"{model} (its server's slots)")):
        if most is not None and n > most:
            raise Refusal(400, f"'n' is {asked_n}{batch}: {whose} takes at most {most} choices a request",
                          "invalid_request_error", "invalid_value")
    caps = {} if echo else {k: v for k in ("max_tokens", "max_completion_tokens")
                            if (v := positive_int(body, k))}
    need = 0 if echo else n
    if room is not None and room < need:
        raise Refusal(429, f"budget exceeded: this request may take {prompt:,} prompt tokens (a bound: "
                      f"the bytes of its text) and {need} completion token(s) at the least; what remains "
                      f"of {budget} besides what its requests in flight hold falls {need - room:,} "
                      "token(s) short", "budget_exceeded", "budget_exceeded", {"x-should-retry": "false"})
    if echo or (room is None and reply_cap is None):
        return 0
    asked = min(caps.values()) if caps else CAP_UNASKED
    cap = asked if reply_cap is None else min(asked, reply_cap)
    cap = cap if room is None else min(cap, room // n)
    for key in caps or ("max_tokens",):
        body[key] = cap
    return 0 if room is None else cap * n


def too_large(max_body: int) -> Refusal:
    return Refusal(413, f"the request body is larger than the gateway's limit of {max_body:,} bytes",
                   "invalid_request_error", "request_too_large")


def not_granted_args(name: object) -> tuple[int, str, str, str]:
    if name is None:
        return (400, "the request names no model ('model' is required)", "invalid_request_error",
                "model_required")
    return (404, f"The model {str(name)[:200]!r} does not exist or you do not have access to it.",
            "invalid_request_error", "model_not_found")

