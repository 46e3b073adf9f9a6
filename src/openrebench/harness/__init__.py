"""The agent harness on Inspect AI: the sandbox and its backends, the scoring service, the score tools,
the agents and the tasks.

`AGENTS` and `ISOLATIONS` are the names registered now (built-in and installed plug-ins), read when
asked, so that importing the harness loads no plug-in.
"""

from ._limits import Limits, ended, results_caption
from ._models import (
    LOCAL_ALIAS,
    Estimate,
    check_client,
    check_credentials,
    estimate_run,
    find_price,
    is_local,
    load_prices,
    resolve_agent_model,
)
from ._offline import use_local_tiktoken_cache
from ._run_models import RunModels, declared_roles, model_usage
from ._sandbox import OpenRebenchSandbox, SandboxConfig
from ._task import (
    TIME_LIMIT_RANGE,
    TIME_LIMIT_RANGE_S,
    TaskArgError,
    check_time_limit,
    environment_tasks,
    model_args,
    rebench_scorer,
    rebench_task,
)
from ._tools import score, score_log
from .agents import AgentSpec, agent_limits, agent_names, get_agent
from .agents.oracle import oracle
from .backends import Backend, isolation_problem, isolations

use_local_tiktoken_cache()  # before Inspect first counts tokens


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "AGENTS":
        return agent_names()
    if name == "ISOLATIONS":
        return isolations()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AGENTS", "ISOLATIONS", "LOCAL_ALIAS", "TIME_LIMIT_RANGE", "TIME_LIMIT_RANGE_S", "AgentSpec",
           "Backend", "Estimate", "Limits", "OpenRebenchSandbox", "RunModels", "SandboxConfig",
           "TaskArgError", "agent_limits", "check_client", "check_credentials", "check_time_limit",
           "declared_roles", "ended", "environment_tasks", "estimate_run", "find_price", "get_agent",
           "is_local", "isolation_problem", "load_prices", "model_args", "model_usage", "oracle",
           "rebench_scorer", "rebench_task", "resolve_agent_model", "results_caption", "score", "score_log"]
