"""The agent harness on Inspect AI: the bubblewrap sandbox, the score tools, agents and tasks."""

from ._limits import Limits, agent_limits, ended, results_caption
from ._models import Estimate, check_client, check_credentials, estimate_run, load_prices
from ._offline import use_local_tiktoken_cache
from ._sandbox import OpenRebenchSandbox, SandboxConfig
from ._task import (
    AGENTS,
    ISOLATIONS,
    TIME_LIMIT_RANGE,
    TIME_LIMIT_RANGE_S,
    TaskArgError,
    check_time_limit,
    environment_tasks,
    oracle,
    rebench_task,
    run_score,
    score,
    score_log,
)

use_local_tiktoken_cache()  # before Inspect first counts tokens

__all__ = ["AGENTS", "ISOLATIONS", "TIME_LIMIT_RANGE", "TIME_LIMIT_RANGE_S", "Estimate", "Limits",
           "OpenRebenchSandbox", "SandboxConfig", "TaskArgError", "agent_limits", "check_client",
           "check_credentials", "check_time_limit", "ended", "environment_tasks", "estimate_run",
           "load_prices", "oracle", "rebench_task", "results_caption", "run_score", "score", "score_log"]
