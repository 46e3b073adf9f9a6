"""`openrebench eval … --cluster ADDRESS`: the attempts planned and checked here, run by the driver,
then a results table and the exit code `openrebench eval` gives (0 all scored, 1 a failure, 130
interrupted)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from openrebench.base import OpenRebenchError

from ._driver import QUEUE_FILE, ClusterEval, Driver, driver_lock
from ._spec import AttemptSpec


def plan_attempts(env_ids: list[str], *, tier: str, agent: str, model: str | None, epochs: int,
                  time_limit_s: float | None = None, isolation: str = "auto",
                  message_limit: str | None = None, token_limit: str | None = None,
                  env_models: Mapping[str, Mapping[str, str]] | None = None,
                  model_budget_usd: float | None = None,
                  model_budget_tokens: str | None = None) -> list[AttemptSpec]:
    """One attempt per environment and epoch, its task arguments checked here as the environment's
    task checks them, except for the hardware: that is the nodes'."""
    from openrebench.harness import check_time_limit, get_agent, isolations, model_args
    from openrebench.runs import get_environment

    if isolation not in isolations():
        raise OpenRebenchError(f"unknown isolation '{isolation}' (known: {', '.join(isolations())})")
    agent_spec = get_agent(agent)
    specs = []
    for env_id in env_ids:
        spec = get_environment(env_id).tier(tier)
        seconds = check_time_limit(time_limit_s) if time_limit_s is not None else spec.time_limit_hours * 3600
        agent_spec.limits(seconds, message_limit, token_limit)  # a bad limit: one line, before any node
        roles = dict((env_models or {}).get(env_id, {}))
        budget = (model_budget_usd, model_budget_tokens) if spec.models else (None, None)
        model_args(env_id, tier, roles, *budget)
        for epoch in range(1, epochs + 1):
            specs.append(AttemptSpec(env_id=env_id, tier=tier, agent=agent, model=model, epoch=epoch,
                                     time_limit_s=time_limit_s, isolation=isolation,
                                     message_limit=message_limit, token_limit=token_limit, env_models=roles,
                                     model_budget_usd=budget[0], model_budget_tokens=budget[1]))
    return specs


def eval_on_cluster(address: str, env_ids: list[str], *, log_dir: Path, runs_dir: Path,
                    retry_attempts: int = 0, resume: bool = False, max_in_flight: int | None = None,
                    display: str | None = None, console: Console | None = None, err: Console | None = None,
                    **attempts: Any) -> int:
    """Plan, run and report a cluster eval (the keyword arguments of `plan_attempts`); returns the exit
    code."""
    console = console or Console()
    err = err or Console(stderr=True)
    specs = plan_attempts(env_ids, **attempts)
    plan = ClusterEval(address=address, specs=specs, log_dir=log_dir, runs_dir=runs_dir,
                       retry_attempts=retry_attempts, resume=resume, max_in_flight=max_in_flight,
                       display=display)
    with driver_lock(plan.log_dir):
        outcome = Driver(plan).run()
    for warning in outcome.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    queue = outcome.queue
    done, failed = queue.attempts("done"), queue.attempts("failed")
    tries = {(t.attempt, t.n): t for t in queue.tries()}
    table = Table(title=f"openrebench eval on {address}", caption_justify="left")
    for col in ("environment", "epoch", "tries", "normalised", "raw", "node", "run"):
        table.add_column(col, justify="right" if col in ("epoch", "tries", "normalised", "raw") else "left")
    for a in done:
        last = tries.get((a.id, a.tries))
        table.add_row(a.spec.env_id, str(a.spec.epoch), str(a.tries),
                      "-" if a.score is None else f"{a.score:.3f}", "-" if a.raw is None else f"{a.raw:.4g}",
                      (last.node or "")[:8] if last else "", a.run_dir or "")
    if table.rows:
        console.print(table)
    for a in failed:
        err.print(f"[bold red]failed:[/] {a.spec.env_id} (epoch {a.spec.epoch}) after {a.tries} tries: "
                  f"{a.reason}", highlight=False, soft_wrap=True)
    left = len(queue) - len(done) - len(failed)
    if outcome.interrupted or left:
        err.print(f"[bold]{left} attempt(s) not finished:[/] continue with the same command and --resume",
                  highlight=False)
    console.print(f"Inspect logs: {plan.log_dir} (queue: {plan.log_dir / QUEUE_FILE}; open the logs with "
                  f"`inspect view --log-dir {shlex.quote(str(plan.log_dir))}`)", highlight=False,
                  soft_wrap=True)
    queue.close()
    if outcome.interrupted:
        return 130
    return 1 if failed or left else 0
