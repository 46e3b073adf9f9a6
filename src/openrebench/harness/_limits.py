"""Guard rails for model-driven agents: message and token limits per attempt, and an idle stop.

The react agent's conversation grows by about two messages per turn (the model's tool call and its
result), and every turn resends the whole conversation, so tokens grow with the square of the turns.
Defaults scale with the working time: 300 messages per hour (one tool call every 24 s, faster than a
model that waits on its own commands) and 2M tokens per hour (16M for 8 hours: about what a 128k-context
model uses before its context overflows, which ends a react attempt anyway without compaction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from openrebench.api import OpenRebenchError

MESSAGES_PER_HOUR = 300
TOKENS_PER_HOUR = 2_000_000
MIN_MESSAGES = 40  # a short attempt still gets room to read, edit and score a few times
MIN_TOKENS = 200_000
IDLE_TURNS = 3  # consecutive model turns without a tool call before the attempt ends
IDLE_KEY = "openrebench:idle_stop"  # in the sample's store when the idle stop ended the attempt

IDLE_PROMPT = ("Please continue by calling a tool (bash, python, score), or call submit() if you are done. "
               "The attempt ends after {turns} turns in a row without a tool call ({left} left).")


@dataclass(frozen=True)
class Limits:
    """What ends an attempt besides its working time; None: no such limit."""

    messages: int | None = None
    tokens: int | None = None
    idle_turns: int | None = None

    def describe(self) -> str:
        parts = [f"{self.messages} messages" if self.messages else "no message limit",
                 f"{fmt_tokens(self.tokens)} tokens" if self.tokens else "no token limit"]
        return ", ".join(parts)

    def metadata(self) -> dict[str, int | None]:
        return {"message_limit": self.messages, "token_limit": self.tokens, "idle_turns": self.idle_turns}


def fmt_tokens(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k" if n >= 1000 else str(n)


def fmt_duration(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


def parse_count(value: int | str | None, what: str) -> int | None:
    """An int, or text such as 4000, 500k or 2M (Inspect's spelling)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        count = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", str(value).replace("_", ""))
        if not m:
            raise OpenRebenchError(f"bad {what} '{value}' (use a number, e.g. 400, 500k or 2M)")
        count = int(float(m[1]) * {"": 1, "k": 1_000, "m": 1_000_000}[m[2].lower()])
    if count is not None and count < 1:
        raise OpenRebenchError(f"bad {what} '{value}' (must be at least 1)")
    return count


def scaled_limits(seconds: float) -> Limits:
    """The defaults of a model-driven agent (react's): messages and tokens in proportion to the working
    time, at least the minimums, and the idle stop."""
    hours = seconds / 3600
    return Limits(max(MIN_MESSAGES, round(MESSAGES_PER_HOUR * hours)),
                  max(MIN_TOKENS, round(TOKENS_PER_HOUR * hours)), IDLE_TURNS)


def stop_when_idle(turns: int = IDLE_TURNS) -> Any:
    """react's on_continue: urge a model that answers without a tool call, end after `turns` in a row.

    Without it, react answers every tool-less turn with a continue prompt until a limit: a model that
    only chats would fill the message limit. The count is read from the messages, so one agent serves
    concurrent samples.
    """
    from inspect_ai.agent import AgentState
    from inspect_ai.log import transcript
    from inspect_ai.model import ChatMessageAssistant
    from inspect_ai.util import store

    async def on_continue(state: AgentState) -> bool | str:
        if state.output.message.tool_calls:
            return True
        idle = 0
        for message in reversed(state.messages):
            if isinstance(message, ChatMessageAssistant):
                if message.tool_calls:
                    break
                idle += 1
        if idle >= turns:
            store().set(IDLE_KEY, idle)
            transcript().info(f"openrebench: attempt ended after {idle} turns without a tool call")
            return False
        return IDLE_PROMPT.format(turns=turns, left=turns - idle)

    return on_continue


def ended(sample: Any) -> str:
    """Why a logged sample's attempt ended, for the results table."""
    if (limit := sample.limit) is not None:
        timed = limit.type in ("time", "working")
        value = fmt_duration(limit.limit) if timed else fmt_tokens(int(limit.limit))
        return f"{limit.type} limit ({value})"
    if (sample.store or {}).get(IDLE_KEY):
        return f"{sample.store[IDLE_KEY]} turns without a tool"
    return "agent done"


def caption(metadata: dict[str, Any] | None, working_s: float | None) -> str:
    """The limits a logged task ran under, from the task metadata `rebench_task` records."""
    meta = metadata or {}
    lim = Limits(meta.get("message_limit"), meta.get("token_limit"), meta.get("idle_turns"))
    own = meta.get("own_clock_s")  # a person's clock (the human agent), which Inspect does not limit
    timed = (f"{fmt_duration(working_s)} working time" if working_s else
             f"{fmt_duration(own)} working time on the person's clock" if own else None)
    parts = [timed, lim.describe(),
             f"stop after {lim.idle_turns} turns without a tool call" if lim.idle_turns else None]
    return "per attempt: " + ", ".join(p for p in parts if p)


def results_caption(logs: list[Any]) -> str:
    """One caption line for the results table: the limits, per task where they differ."""
    captions: dict[tuple[str, float | None], str] = {}
    for log in logs:
        limit = getattr(log.eval.config, "working_limit", None)
        captions[(log.eval.task, limit)] = caption(log.eval.metadata, limit)
    if len(set(captions.values())) <= 1:
        return next(iter(captions.values()), "")
    return "; ".join(f"{task}: {text}" for (task, _), text in captions.items())
