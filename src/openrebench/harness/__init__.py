"""The agent harness on Inspect AI: the bubblewrap sandbox, the score tools, agents and tasks."""

from ._limits import Limits, agent_limits, ended, results_caption
from ._models import Estimate, check_client, estimate_run
from ._offline import use_local_tiktoken_cache
from ._sandbox import OpenRebenchSandbox, SandboxConfig
from ._task import TASKS, oracle, rebench_task, run_score, score, score_log

use_local_tiktoken_cache()  # before Inspect first counts tokens

__all__ = ["TASKS", "Estimate", "Limits", "OpenRebenchSandbox", "SandboxConfig", "agent_limits",
           "check_client", "ended", "estimate_run", "oracle", "rebench_task", "results_caption", "run_score",
           "score", "score_log"]
