"""One run by hand: `start`, `score`, `log`, `result`, and `demo`, which does them all once with the
reference solution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markdown import Markdown

from openrebench.api import show_progress
from openrebench.runs import Run, final_score

from ._common import (
    RunDir,
    TierOpt,
    console,
    err,
    fail_on_setup_infrastructure,
    fmt,
    get_env,
    log_table,
    models_access,
    print_constants,
    print_row,
    run_access,
    score_with_status,
    user_errors,
)


@user_errors
def start(
    env_id: Annotated[str, typer.Argument(help="Environment id (see `openrebench list`).")],
    directory: Annotated[Path, typer.Argument(help="New run directory.")],
    tier: TierOpt = "mini",
    seed: Annotated[int | None, typer.Option(help="Seed for asset building (default: random).")] = None,
) -> None:
    """Set up a run: workspace, protected data, and the (uncharged) scoring of the starting solution."""
    from openrebench.runs import start_run

    env = get_env(env_id)
    env.tier(tier)
    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory, seed=seed, access=models_access(env_id, tier))
        assert row is not None
    console.print(Markdown(env.instructions(tier)))
    print_row(run, row)
    print_constants(run)
    console.print(f"\nWorkspace: [bold]{run.workspace}[/]\nScore with: openrebench score {run.path}")
    if env.tier(tier).models:
        console.print(f"Its models in your shell (OPENAI_BASE_URL and the key): openrebench shell {run.path}")
    fail_on_setup_infrastructure(run, row)


@user_errors
def score(directory: RunDir = Path(".")) -> None:
    """Score the run's current solution and append the result to its score log."""
    run = Run.open(directory)
    print_row(run, score_with_status(run, "Scoring", access=run_access(run)))


@user_errors
def shell(
    directory: Annotated[Path, typer.Argument(help="The run directory (from `openrebench start`).")],
    command: Annotated[list[str] | None, typer.Argument(
        help="The command to run (default: your $SHELL); put it after --.")] = None,
) -> None:
    """Work on a run by hand with its models: a shell (or COMMAND) in the run's workspace, with
    OPENAI_BASE_URL and OPENAI_API_KEY set to the run's gateway, served by this command until it ends.

    The models are the run's (its tier's, or what its set-up was given), and calls spend the run's
    attempt budget, as an agent's do: exactly what an agent's sandbox is given.
    """
    import os
    import subprocess
    import sys

    from openrebench.api import OpenRebenchError
    from openrebench.gateway import exec_prefix
    from openrebench.harness import RunModels

    run = Run.open(directory)
    models = RunModels.of_run(run)
    if models is None:
        raise OpenRebenchError(f"{run.info.env_id} ({run.info.tier}) gives its agent no models: there is "
                               "no gateway to serve; work in the workspace directly")
    grant = models.agent(run)
    assert grant.socket_path is not None  # the service makes one per grant
    argv = command or [os.environ.get("SHELL") or "/bin/sh"]
    roles = ", ".join(f"{role} ({model})" for role, model in models.models.items())
    err.print(f"The run's models on its gateway: {roles}. OPENAI_BASE_URL and OPENAI_API_KEY are set "
              "in this shell; exit it to stop the gateway.", highlight=False)
    try:
        code = subprocess.call([*exec_prefix(grant.socket_path, 0, python=sys.executable), *argv],
                               cwd=run.workspace, env={**os.environ, "OPENAI_API_KEY": grant.token})
    except FileNotFoundError:
        raise OpenRebenchError(f"no such command: {argv[0]}") from None
    finally:
        models.close()
    raise typer.Exit(code)


@user_errors
def log(directory: RunDir = Path(".")) -> None:
    """Show the score log."""
    run = Run.open(directory)
    rows, warnings = run.rows()
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}")
    console.print(log_table(run, rows))


@user_errors
def result(directory: RunDir = Path(".")) -> None:
    """Show the run's final raw and normalised score."""
    from openrebench.runs import final_row

    run = Run.open(directory)
    env = get_env(run.info.env_id)
    rows, _ = run.rows()
    raw, norm = final_score(rows, env.direction, run.info.constants)
    row = final_row(rows, env.direction)
    which = "no valid score" if row is None else f"row #{row.index} ({env.direction.value} valid row)"
    console.print(f"final raw score: [bold]{fmt(raw)}[/]   normalised: [bold]{norm:.3f}[/]   from {which}")
    console.print(f"normalisation: start {run.info.constants.start:.4f}, reference "
                  f"{run.info.constants.reference:.4f} ({run.info.constants.source})", highlight=False)


@user_errors
def demo(
    env_id: Annotated[str, typer.Argument(help="Environment id.")] = "optimize_kernel",
    tier: TierOpt = "mini",
    directory: Annotated[Path | None, typer.Option("--dir", help="Run directory (default: a new one "
                                                                 "under ./runs).")] = None,
) -> None:
    """End to end: start a run, score the start, put the reference in place, score it, show the log."""
    import time

    from openrebench.runs import install_reference, start_run

    env = get_env(env_id)
    env.tier(tier)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    directory = (directory or Path("runs") / f"demo-{env_id}-{tier}-{stamp}").absolute()
    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory, access=models_access(env_id, tier))
        assert row is not None
    print_row(run, row)
    print_constants(run)
    fail_on_setup_infrastructure(run, row)
    install_reference(run)
    console.print("Reference solution put in place of the agent's.")
    print_row(run, score_with_status(run, "Scoring the reference solution", access=run_access(run)))
    rows, _ = run.rows()
    console.print(log_table(run, rows))
    raw, norm = final_score(rows, env.direction, run.info.constants)
    console.print(f"final: raw {fmt(raw)}, normalised [bold]{norm:.3f}[/] "
                  f"(constants: {run.info.constants.source})", highlight=False)
