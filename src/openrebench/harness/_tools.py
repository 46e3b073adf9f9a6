"""The harness's own tools for model agents: `score` and `score_log`, the tool twins of the sandbox's
`score` and `score log` commands (the harness scores; the agent only asks), and `score_tools`, the
task's set-up step that offers them to any solver (one brought with `inspect eval --solver` too)."""

from __future__ import annotations

from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import Tool, ToolDef, tool

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


@solver
def score_tools() -> Solver:
    """Adds `score` and `score_log` to the task state's tools, for the solvers that read them there
    (Inspect's `basic_agent`, `use_tools`, a loop of `generate`), and only those it does not hold yet.

    The task's set-up step: Inspect runs it before the solver, even one replaced with `--solver`. An
    Inspect agent (`react()`, any `@agent`) never sees the state's tools (its state holds messages
    only), so the built-in agents name the tools themselves and are offered them once."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        held = {ToolDef(t).name for t in state.tools}
        state.tools.extend(t for t in (score(), score_log()) if ToolDef(t).name not in held)
        return state

    return solve
