"""Agents by name: what `--agent` and `-T agent=` take.

A built-in agent is a module here naming its `AgentSpec` `AGENT` (oracle, react, human); a
third-party one is an entry point in the group `openrebench.agents` (`name = "package.module:AGENT"`),
so a lab can ship its own agent in its own package. The harness and the CLI read what they need
(whether a model is needed, the default limits) from the spec, never from the name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from inspect_ai.agent import Agent

from openrebench.api import Environment
from openrebench.base import OpenRebenchError, check_name, discover

from .._limits import Limits, parse_count

ENTRY_POINT_GROUP = "openrebench.agents"

AgentFactory = Callable[[Environment, str, float], Agent]
"""Makes the agent of one task: (the environment, the tier, the working time in seconds)."""


@dataclass(frozen=True)
class AgentSpec:
    """An agent as the harness knows it.

    name: what `--agent` takes. factory: makes the Inspect agent for one task. description: one line
    for people choosing one. needs_model: whether it calls a model (the CLI then wants `--model` and
    bounds the cost). default_limits: its message and token limits for a working time, where it has
    any (explicit limits override them); None: only explicit limits. own_clock: the agent counts its
    working time itself (the human agent's clock, which a person pauses), so the task sets no Inspect
    working limit and the harness refuses scorings once that clock has passed the working time.
    """

    name: str
    factory: AgentFactory
    description: str
    needs_model: bool = False
    default_limits: Callable[[float], Limits] | None = None
    own_clock: bool = False  # it keeps its own working clock (a person's, with pauses): no Inspect limit

    def limits(self, seconds: float, messages: int | str | None = None,
               tokens: int | str | None = None) -> Limits:
        """The limits of an attempt of `seconds` working time: the explicit ones (400, 500k, 2M), else
        the agent's defaults."""
        messages, tokens = parse_count(messages, "message limit"), parse_count(tokens, "token limit")
        if self.default_limits is None:
            return Limits(messages, tokens)
        default = self.default_limits(seconds)
        return Limits(messages or default.messages, tokens or default.tokens, default.idle_turns)


def _check(spec: object, origin: str) -> AgentSpec:
    if not isinstance(spec, AgentSpec):
        raise OpenRebenchError(f"{origin} is not an openrebench AgentSpec")
    check_name(spec.name, origin, "agent")
    if not callable(spec.factory):
        raise OpenRebenchError(f"{origin}: the agent's factory is not callable")
    return spec


@functools.cache
def agent_specs() -> dict[str, AgentSpec]:
    """Every agent by name, sorted by name (built-in and installed plug-ins)."""
    return discover(__name__, "AGENT", ENTRY_POINT_GROUP, _check, lambda spec: spec.name)


def agent_names() -> tuple[str, ...]:
    return tuple(agent_specs())


def get_agent(name: str) -> AgentSpec:
    """The agent of this name, else a one-line error."""
    try:
        return agent_specs()[name]
    except KeyError:
        raise OpenRebenchError(f"unknown agent '{name}' (known: {', '.join(agent_specs())})") from None


def agent_limits(agent: str, seconds: float, messages: int | str | None = None,
                 tokens: int | str | None = None) -> Limits:
    """The limits of an attempt by the agent of this name (see `AgentSpec.limits`)."""
    return get_agent(agent).limits(seconds, messages, tokens)


def refresh() -> None:
    """Forget what was found (after installing a plug-in in a running process, as tests do)."""
    agent_specs.cache_clear()


__all__ = ["ENTRY_POINT_GROUP", "AgentFactory", "AgentSpec", "agent_limits", "agent_names", "agent_specs",
           "get_agent", "refresh"]
