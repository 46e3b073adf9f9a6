"""`openrebench eval`: agents on environments through Inspect AI, a results table, and an exit code
that says whether every attempt was scored."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand

from openrebench.api import OpenRebenchError

from ._common import TierOpt, console, duration, err, get_env, parse_env_models, user_errors
from ._eval_results import report

# What the help says of some agents and isolations; the names themselves come from the harness's
# registries, so one registered later is listed (without a note) with no change here.
AGENT_NOTES = {"oracle": "no model"}
ISOLATION_NOTES = {"auto": "an isolating sandbox (bwrap), else an error naming what is missing",
                   "none": "no isolation at all: only by name, marked UNISOLATED in the results"}
AGENTS_HELP = "{agents}"
ISOLATIONS_HELP = "{isolations}"


def _choices(names: Iterable[str], notes: Mapping[str, str], serial_comma: bool) -> str:
    """'a (note), b or c.': each name with its note, if any, as one sentence."""
    items = [f"{n} ({notes[n]})" if n in notes else n for n in names]
    if len(items) < 2:
        return "".join(items) + "."
    return ", ".join(items[:-1]) + ("," if serial_comma else "") + f" or {items[-1]}."


class EvalCommand(TyperCommand):
    """Fills the agents and isolations into the help from the harness only when the help is shown:
    importing the harness (Inspect AI) takes seconds, too long for every start of the command."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from openrebench.harness import AGENTS, ISOLATIONS

        filled = {AGENTS_HELP: _choices(AGENTS, AGENT_NOTES, serial_comma=False),
                  ISOLATIONS_HELP: _choices(ISOLATIONS, ISOLATION_NOTES, serial_comma=True)}
        for param in self.params:
            help_text = getattr(param, "help", None)
            if help_text in filled:
                param.help = filled[help_text]  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)


def _check_gpus(env_ids: list[str], tier: str) -> None:
    """Fail before Inspect starts when a tier needs more GPUs than the pool attempts lease from
    (OPENREBENCH_GPUS) holds. (A machine without the GPU at all is refused when the task is made.)"""
    from openrebench.isolation import visible_gpus

    for env_id in env_ids:
        spec = get_env(env_id).tier(tier)
        if spec.gpu_count > (have := len(visible_gpus())):
            raise OpenRebenchError(f"{env_id} ({tier}) needs {spec.gpu_count} GPU(s); the pool holds {have} "
                                   "(OPENREBENCH_GPUS)")


def _time_limits(text: str | None) -> list[float | None]:
    """`--time-limit`: one working time, several (a campaign), or None for the tier's."""
    if not text:
        return [None]
    limits = [duration(part.strip()) for part in text.split(",")]
    if len(set(limits)) != len(limits):
        raise OpenRebenchError(f"--time-limit {text}: a time limit is given twice")
    return list(limits)


def parse_model_args(pairs: list[str]) -> tuple[str | None, dict[str, Any]]:
    """`-M KEY=VALUE` values as (base URL, the other model args) for Inspect. A value reads as JSON where
    it can (`5`, `true`), else as text. `base_url` comes apart because Inspect's `eval` gives it to the
    model as a parameter of its own (`model_base_url`): in the model args too, the model would get it
    twice and fail with a TypeError."""
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise OpenRebenchError(f"bad --model-arg '{pair}' (use KEY=VALUE, e.g. "
                                   "base_url=http://localhost:8000/v1)")
        try:
            args[key] = json.loads(text)
        except ValueError:
            args[key] = text
    base_url = args.pop("base_url", None)
    if base_url is not None and not isinstance(base_url, str):
        raise OpenRebenchError(f"bad --model-arg base_url={base_url}: give a URL")
    return base_url, args


def model_options(model: str | None, model_arg: list[str], max_retries: int | None, timeout: int | None,
                  max_connections: int | None) -> dict[str, Any]:
    """The keyword arguments of Inspect's `eval` (and `eval_set`) that make and drive the agent's model,
    only those given, so that Inspect's defaults stay its own. Those are unlimited retries and no
    timeout: a provider that cannot be reached is retried silently for ever (retrying is waiting, not
    working time, so no working limit ends it) unless --max-retries or --timeout says otherwise."""
    base_url, args = parse_model_args(model_arg)
    if (base_url is not None or args) and model is None:
        raise OpenRebenchError("--model-arg applies to the agent's model: give --model too")
    options: dict[str, Any] = {"model_base_url": base_url, "model_args": args, "max_retries": max_retries,
                               "timeout": timeout, "max_connections": max_connections}
    return {k: v for k, v in options.items() if v is not None and v != {}}


def _flags(options: Mapping[str, Any]) -> list[str]:
    """The options of `openrebench eval` that gave these Inspect arguments, for a message."""
    names = {"model_base_url": "--model-arg", "model_args": "--model-arg", "max_retries": "--max-retries",
             "timeout": "--timeout", "max_connections": "--max-connections"}
    return list(dict.fromkeys(names[k] for k in options))


@user_errors
def eval_(
    env_ids: Annotated[list[str], typer.Argument(help="Environment ids, or 'all'.")],
    tier: TierOpt = "mini",
    agent: Annotated[str, typer.Option(help=AGENTS_HELP)] = "oracle",
    solver: Annotated[str | None, typer.Option(
        help="An Inspect solver or agent of your own instead of --agent's, as `inspect eval --solver` takes "
             "it: a registered name or FILE.py@NAME. It gets the instructions as its input and the score "
             "and score_log tools in the state's tools.")] = None,
    model: Annotated[str | None, typer.Option(help="Inspect model, e.g. openai/gpt-4o, or 'local' (the "
                                                   "offline Gemma 3 270M, served on this machine).")] = None,
    model_arg: Annotated[list[str] | None, typer.Option(
        "--model-arg", "-M", help="An argument for making the agent's model, KEY=VALUE (repeatable), as "
                                  "`inspect eval -M` takes it: e.g. base_url=http://localhost:8000/v1 or "
                                  "api_key=…; a value reads as JSON where it can (5, true), else as text."
    )] = None,
    max_retries: Annotated[int | None, typer.Option(
        min=0, help="Retries of a failed model request (default: Inspect's, unlimited with backoff: a "
                    "provider that cannot be reached keeps an attempt waiting, and waiting is not working "
                    "time); 0 ends the attempt with the provider's error at the first failure.")] = None,
    timeout: Annotated[int | None, typer.Option(
        min=1, help="Seconds one model request may take, its retries included (default: no limit).")] = None,
    max_connections: Annotated[int | None, typer.Option(
        min=1, help="Model requests in flight at once, over all attempts (default: the provider's, in "
                    "Inspect).")] = None,
    time_limit: Annotated[str | None, typer.Option(help="Working time per run, e.g. 30m, 2h or seconds, "
                                                         "from 1m to 7d (default: the tier's); several, "
                                                         "comma-separated (30m,2h,8h), run each "
                                                         "environment at each: a best-of-k campaign "
                                                         "with --epochs k.")] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Runs per environment.")] = 1,
    log_dir: Annotated[Path, typer.Option(help="Where Inspect writes its logs.")] = Path("logs"),
    runs_dir: Annotated[Path, typer.Option(help="Where run directories go.")] = Path("runs"),
    isolation: Annotated[str, typer.Option(help=ISOLATIONS_HELP)] = "auto",
    retry_attempts: Annotated[int, typer.Option(min=0, help="Retry failed tasks this many times, "
                                                             "resuming from the logs (Inspect's eval_set)."
                                                )] = 0,
    resume: Annotated[bool, typer.Option(help="Reuse finished work in --log-dir (Inspect's eval_set): "
                                              "only what is missing or failed runs again, and an attempt "
                                              "left unfinished (a crash, a cut-off session) continues in "
                                              "its run directory with its charged time.")] = False,
    max_samples: Annotated[int | None, typer.Option(help="Attempts run at once.")] = None,
    display: Annotated[str | None, typer.Option(help="Inspect's progress display: full, rich, plain, "
                                                     "none (default: Inspect's).")] = None,
    message_limit: Annotated[str | None, typer.Option(help="Messages per attempt (react default: 300 per "
                                                           "hour of working time, at least 40).")] = None,
    token_limit: Annotated[str | None, typer.Option(help="Tokens per attempt, e.g. 500k or 2M (react "
                                                         "default: 2M per hour of working time).")] = None,
    prices: Annotated[Path | None, typer.Option(help="JSON of US$ per 1M tokens by model for the cost "
                                                     'estimate and the environments\' models\' dollar '
                                                     'budgets: {"openai/gpt-4o": {"input": 2.5, '
                                                     '"output": 10}}.')] = None,
    max_cost: Annotated[float, typer.Option(help="Stop before a react run whose cost bound (US$) is "
                                                 "above this, unless --yes.")] = 50.0,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Run even above --max-cost.")] = False,
    env_model: Annotated[list[str] | None, typer.Option(
        help="The model of one of the environment's model roles, ROLE=MODEL (repeatable): an Inspect model "
             "or 'local' (the offline Gemma 3 270M). See `openrebench info ENV` for the roles.")] = None,
    model_budget_usd: Annotated[float | None, typer.Option(
        help="Per-run budget in US$ for the environment's models (default: the tier's), enforced by "
             "the model gateway.")] = None,
    model_budget_tokens: Annotated[str | None, typer.Option(
        help="Per-run budget in tokens for the environment's models, e.g. 200k (default: the tier's)."
    )] = None,
    login_user: Annotated[str | None, typer.Option(
        help="With --agent human and a harness run as root: the person (user name) whose login command it "
             "is, so that they log in as themselves.")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Run each attempt as a task on this Ray cluster (its address, or 'local' to start one here); "
             "--log-dir and --runs-dir must be shared storage. Needs Ray (the ray extra).")] = None,
) -> None:
    """Run agents on environments through Inspect AI, then print a results table.

    Exits 1 when an attempt fails or ends without a score (listed after the table), 130 when interrupted.
    """
    from inspect_ai import eval as inspect_eval
    from inspect_ai import eval_set
    from inspect_ai.solver import SolverSpec

    plan = _plan(env_ids, tier, agent, solver, model, model_arg or [], max_retries, timeout, max_connections,
                 time_limit, isolation, cluster, prices, env_model or [],
                 {"model_budget_usd": model_budget_usd, "model_budget_tokens": model_budget_tokens})
    if cluster is not None:  # each attempt a Ray task on the node that holds its GPUs: openrebench.cluster
        _eval_on_cluster(plan, cluster, log_dir=log_dir, runs_dir=runs_dir, retry_attempts=retry_attempts,
                         resume=resume, max_samples=max_samples, display=display, isolation=isolation,
                         epochs=epochs, message_limit=message_limit, token_limit=token_limit, prices=prices,
                         max_cost=max_cost, yes=yes)
        return
    if login_user is not None:
        _check_user(login_user)
        os.environ["OPENREBENCH_LOGIN_USER"] = login_user
    if resume:  # read by each attempt's set-up, not a task argument (which would change the tasks' identity)
        os.environ["OPENREBENCH_RESUME"] = "1"
    tasks = _tasks(plan, runs_dir=runs_dir, isolation=isolation, message_limit=message_limit,
                   token_limit=token_limit, solver=solver)
    if plan.agent_spec.needs_model and plan.model is not None:
        _check_cost(plan.model, plan.ids, tier, plan.limits, epochs, message_limit, token_limit, prices,
                    agent, max_cost, yes)
    _check_credentials(plan, tasks)
    # "none" is Inspect's no-model model: the oracle and human agents call none, and the display says so.
    options = {"model": plan.model or "none", "epochs": epochs, "log_dir": str(log_dir),
               "max_samples": max_samples, "display": display, **plan.made_with,
               **({"solver": SolverSpec(solver)} if solver is not None else {})}
    began = time.monotonic()
    with plan.serving, _keeping_local(plan):
        if retry_attempts or resume:
            _, logs = eval_set(tasks, retry_attempts=retry_attempts, **options)  # type: ignore[arg-type]
        else:
            logs = inspect_eval(tasks, **options)  # type: ignore[arg-type]
    report(logs, plan.ids, tasks, f"openrebench eval — {solver or agent} on {tier}", time.monotonic() - began,
           log_dir, campaign=len(plan.limits) > 1)


def _keeping_local(plan: _Plan) -> contextlib.AbstractContextManager[Any]:
    """The offline model kept for the whole eval where an environment's role uses it (chat_rl's judge,
    rust_codecontests' task model): otherwise each run would start the agent's side's server again and
    each scoring reload the judge's weights (several seconds each on a small CPU). Each scoring's own
    server, which holds its held-out prompts, is started and stopped with it all the same."""
    from openrebench.api import LOCAL_MODEL
    from openrebench.runs import tier_models

    def uses_local(env_id: str) -> bool:
        return LOCAL_MODEL in tier_models(get_env(env_id), plan.tier, plan.env_models.get(env_id)).values()

    if not any(uses_local(e) for e in plan.ids):
        return contextlib.nullcontext()
    from openrebench.gateway import model_service

    return model_service().keep_local()


@dataclass
class _Plan:
    """eval's arguments, checked once: what every later step reads."""

    ids: list[str]
    tier: str
    agent: str
    agent_spec: Any
    model: str | None
    serving: contextlib.AbstractContextManager[Any]  # the local model's server while the eval runs
    made_with: dict[str, Any]  # Inspect's options for making the agent's model
    limits: list[float | None]  # working time per run, one campaign per entry
    env_models: dict[str, dict[str, Any]]
    budgets: dict[str, Any]


def _plan(env_ids: list[str], tier: str, agent: str, solver: str | None, model: str | None,
          model_arg: list[str], max_retries: int | None, timeout: int | None, max_connections: int | None,
          time_limit: str | None, isolation: str, cluster: str | None, prices: Path | None,
          env_model: list[str], budgets: dict[str, Any]) -> _Plan:
    """Every argument checked before anything is set up; one line naming what is wrong otherwise."""
    from openrebench.harness import (
        ISOLATIONS,
        check_client,
        get_agent,
        isolation_problem,
        resolve_agent_model,
    )
    from openrebench.runs import environment_classes

    ids = list(environment_classes()) if env_ids == ["all"] else env_ids
    for env_id in ids:
        get_env(env_id).tier(tier)
    agent_spec = get_agent(agent)  # one line naming the registered agents where unknown
    if isolation not in ISOLATIONS:
        raise OpenRebenchError(f"unknown isolation '{isolation}' (known: {', '.join(ISOLATIONS)})")
    if cluster is None and (problem := isolation_problem(isolation)):  # on a cluster, the nodes' to say
        raise OpenRebenchError(f"--isolation {isolation}: {problem}")
    if agent_spec.needs_model and model is None:
        raise OpenRebenchError(f"the {agent} agent needs --model")
    if solver is not None and (cluster is not None or agent != "oracle"):
        raise OpenRebenchError("--solver runs on one machine, in place of --agent: leave out "
                               + ("--cluster" if cluster is not None else "--agent"))
    model, serving = resolve_agent_model(model)  # `local`: the offline model, served while the eval runs
    if model is not None:
        check_client(model)
    made_with = model_options(model, model_arg, max_retries, timeout, max_connections)
    if cluster is not None and made_with:
        raise OpenRebenchError(f"--cluster does not pass {', '.join(_flags(made_with))} to its nodes yet: "
                               "leave them out or run on one machine")
    limits = _time_limits(time_limit)
    if cluster is not None and len(limits) > 1:
        raise OpenRebenchError("--cluster runs one --time-limit per campaign: give one, and run the "
                               "command once per time limit")
    if prices is not None:  # the environments' models are priced, and their dollar budgets kept, by these
        from openrebench.gateway import load_prices, model_service

        model_service().prices = load_prices(prices)
    env_models = parse_env_models(env_model, ids, tier)
    if any(v is not None for v in budgets.values()) and not any(get_env(e).tier(tier).models for e in ids):
        raise OpenRebenchError(f"--model-budget-*: no environment chosen declares models in the {tier} tier")
    return _Plan(ids, tier, agent, agent_spec, model, serving, made_with, limits, env_models, budgets)


def _eval_on_cluster(plan: _Plan, cluster: str, *, log_dir: Path, runs_dir: Path, retry_attempts: int,
                     resume: bool, max_samples: int | None, display: str | None, isolation: str, epochs: int,
                     message_limit: str | None, token_limit: str | None, prices: Path | None, max_cost: float,
                     yes: bool) -> None:
    """The campaign as Ray tasks (openrebench.cluster); exits with its code where it is not 0."""
    from openrebench.cluster import eval_on_cluster
    from openrebench.harness import check_credentials

    seconds = plan.limits[0]
    if plan.agent_spec.needs_model and plan.model is not None:
        _check_cost(plan.model, plan.ids, plan.tier, seconds, epochs, message_limit, token_limit, prices,
                    plan.agent, max_cost, yes)
    if plan.model is not None:  # the driver passes provider keys (*_API_KEY) to the nodes
        check_credentials(plan.model)
    code = eval_on_cluster(cluster, plan.ids, log_dir=log_dir, runs_dir=runs_dir,
                           retry_attempts=retry_attempts, resume=resume, max_in_flight=max_samples,
                           display=display, console=console, err=err,
                           tier=plan.tier, agent=plan.agent, model=plan.model, epochs=epochs,
                           time_limit_s=seconds, isolation=isolation, message_limit=message_limit,
                           token_limit=token_limit, env_models=plan.env_models, **plan.budgets)
    if code:
        raise typer.Exit(code)


def _tasks(plan: _Plan, *, runs_dir: Path, isolation: str, message_limit: str | None,
           token_limit: str | None, solver: str | None) -> list[Any]:
    """One Inspect task per environment and time limit; making them checks their arguments and the
    machine (nothing is set up yet)."""
    from openrebench.harness import environment_tasks

    made = environment_tasks()
    tasks = [made[e](tier=plan.tier, agent=plan.agent, time_limit=s, runs_dir=str(runs_dir.resolve()),
                     isolation=isolation, message_limit=message_limit, token_limit=token_limit,
                     **(plan.budgets if get_env(e).tier(plan.tier).models else {}), **plan.env_models[e])
             for e in plan.ids for s in plan.limits]
    _check_gpus(plan.ids, plan.tier)
    if solver is not None:  # the analysis groups attempts by the task's agent: name the one that ran
        for t in tasks:
            t.metadata = {**(t.metadata or {}), "agent": solver}
    return tasks


def _check_credentials(plan: _Plan, tasks: list[Any]) -> None:
    """The agent's model's key, and the environments' models' (the harness holds them: the sandboxes
    never see them)."""
    from openrebench.harness import check_credentials

    if plan.model is not None:
        check_credentials(plan.model, plan.made_with.get("model_base_url"), plan.made_with.get("model_args"))
    env_specs = {m for t in tasks for m in (t.metadata or {}).get("env_models", {}).values()}
    for spec in sorted(env_specs - {"local"}):
        check_credentials(spec)


def _check_cost(model: str, ids: list[str], tier: str, limits: float | Sequence[float | None] | None,
                epochs: int, message_limit: str | None, token_limit: str | None, prices: Path | None,
                agent: str, max_cost: float, yes: bool) -> None:
    """The cost estimate of a model agent's campaign, printed, then stopped above --max-cost unless --yes."""
    from openrebench.harness import estimate_run

    estimate = estimate_run(model, ids, tier, limits, epochs, message_limit, token_limit, prices, agent=agent)
    console.print("\n".join(estimate.lines()), highlight=False, markup=False)
    estimate.check(max_cost, yes)


def _check_user(name: str) -> None:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        raise OpenRebenchError(f"--login-user {name}: no such user on this machine") from None
