"""The human agent: Inspect's, for a person. It prints a login command: a shell in the attempt's sandbox
with `score`, `score log` and Inspect's `task` command (`task submit` ends the attempt, `task stop` and
`task start` pause and resume the clock). Any number of terminals may log in at once; all share the one
sandbox and its processes, and tmux in it outlives a dropped connection.

The clock is the human agent's own: it stops while the person has paused it, both in Inspect's display
and in the working time each scoring logs, and the attempt's working time is counted on it (Inspect's
working limit, which cannot see a pause, is not applied; once the clock passes the working time, scorings
are refused and the person submits). A resumed attempt (`openrebench eval ... --resume`) starts the clock
where the interrupted session left it."""

from __future__ import annotations

from inspect_ai.agent import Agent, AgentState, agent, human_cli
from inspect_ai.util import store

from openrebench.api import Environment

from .._sandbox import HUMAN_STATE, run_sandbox
from . import AgentSpec

HUMAN_INSTRUCTIONS = """Your solution lives in /workspace. Run `score` to have the harness score it \
(every scoring is logged; the best valid one counts, or the last one where the task says so) and \
`score log` to see the scorings so far. Open as many terminals as you like with the login command: they \
share this one machine, and what runs in tmux (or under nohup) keeps running when a connection drops. \
While a scoring runs, every process of yours is frozen and resumes afterwards. `task stop` pauses the \
clock, `task start` resumes it; `task submit` ends the attempt."""


@agent
def human() -> Agent:
    """Inspect's human agent, its clock started where a resumed attempt's earlier sessions left it."""
    inner = human_cli(answer=False, intermediate_scoring=False, instructions=HUMAN_INSTRUCTIONS)

    async def execute(state: AgentState) -> AgentState:
        charged = run_sandbox().charged_before
        if charged:
            store().set(f"{HUMAN_STATE}:accumulated_time", charged)
        return await inner(state)

    return execute


def _make(env: Environment, tier: str, time_limit_s: float) -> Agent:
    return human()


AGENT = AgentSpec(name="human", factory=_make, own_clock=True,
                  description="a person, in login shells in the sandbox (Inspect's human agent)")
