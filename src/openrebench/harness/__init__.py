"""The agent harness on Inspect AI: the bubblewrap sandbox, the score tools, agents and tasks."""

from ._sandbox import OpenRebenchSandbox, SandboxConfig
from ._task import TASKS, oracle, rebench_task, run_score, score, score_log

__all__ = ["TASKS", "OpenRebenchSandbox", "SandboxConfig", "oracle", "rebench_task", "run_score", "score",
           "score_log"]
