"""The harness's own tools for model agents: `score` and `score_log`, the tool twins of the sandbox's
`score` and `score log` commands (the harness scores; the agent only asks)."""

from __future__ import annotations

from inspect_ai.tool import Tool, tool

from ._sandbox import run_sandbox
from ._score_service import format_log


@tool
def score() -> Tool:
    async def execute() -> str:
        """Score the current solution in /workspace (the harness runs the protected scorer).

        Returns:
            The scorer's message, the score where the environment shows it, and the time left.
        """
        box = run_sandbox()
        return box.describe(await box.score())

    return execute


@tool
def score_log() -> Tool:
    async def execute() -> str:
        """Show every scoring so far in this run.

        Returns:
            One line per scoring: time, score (or invalid) and message.
        """
        return format_log(run_sandbox().run)

    return execute
