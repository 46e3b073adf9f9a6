"""The human agent: Inspect's, for a person. It prints a login command: a shell in the same sandbox
with `score`, `score log` and Inspect's `task` command (`task submit` ends the attempt)."""

from __future__ import annotations

from inspect_ai.agent import Agent, human_cli

from openrebench.api import Environment

from . import AgentSpec

HUMAN_INSTRUCTIONS = """Your solution lives in /workspace. Run `score` to have the harness score it \
(every scoring is logged; the best valid one counts, or the last one where the task says so) and \
`score log` to see the scorings so far. `task submit` ends the attempt."""


def _make(env: Environment, tier: str, time_limit_s: float) -> Agent:
    return human_cli(answer=False, intermediate_scoring=False, instructions=HUMAN_INSTRUCTIONS)


AGENT = AgentSpec(name="human", factory=_make,
                  description="a person, in a login shell in the sandbox (Inspect's human agent)")
