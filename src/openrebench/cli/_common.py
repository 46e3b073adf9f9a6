"""What every command shares: the two consoles, user errors as one red line, the options that several
commands take, and the printing of score rows. Command modules import this and lower layers, never
each other or the package that assembles them."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from openrebench.api import Environment, OpenRebenchError
from openrebench.runs import Run, ScoreRow, ScoringAccessFn

console = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

TierOpt = Annotated[str, typer.Option("--tier", "-t", help="mini (CPU) or full (GPU).")]
RunDir = Annotated[Path, typer.Argument(help="The run directory (or any folder inside it).")]


def user_errors(fn: F) -> F:
    """Turn user-facing errors into one red line and exit code 1 (130 on Ctrl-C), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OpenRebenchError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def get_env(env_id: str) -> Environment:
    """The environment with this id from the registry, else a one-line error naming the known ones."""
    from openrebench.runs import get_environment

    return get_environment(env_id)


def fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def score_with_status(run: Run, label: str, **kwargs: Any) -> ScoreRow:
    """Score with a spinner: a scoring can take minutes and prints nothing until it ends."""
    from openrebench.runs import score_run

    with console.status(f"{label} (scoring runs in a separate process; this can take a while)…"):
        return score_run(run, **kwargs)


def print_row(run: Run, row: ScoreRow) -> None:
    """A scored row as a panel; a failure of the harness's own is also named as such on stderr, so it
    is not read as the solution's."""
    style = "green" if row.valid else "red"
    console.print(Panel(run.describe(row), title=f"score #{row.index}", border_style=style), highlight=False)
    if row.details.get("infrastructure"):
        cause = row.details.get("error") or str(row.details.get("scorer_stderr", "")).strip()[-600:]
        err.print(f"[yellow]infrastructure failure, not the solution's:[/] row #{row.index} of "
                  f"{run.score_log_path}" + (f"\n{cause}" if cause else ""), highlight=False, soft_wrap=True)


def print_constants(run: Run) -> None:
    c = run.info.constants
    console.print(f"normalisation: start {c.start:.4f}, reference {c.reference:.4f} ({c.source})",
                  highlight=False, soft_wrap=True)


def fail_on_setup_infrastructure(run: Run, row: ScoreRow) -> None:
    """The starting solution could not be scored for the harness's own reason: the run is set up but
    has no baseline, so say so and exit non-zero (after fixing the cause: `openrebench score DIR`)."""
    if row.details.get("infrastructure"):
        raise OpenRebenchError(f"the starting solution of {run.path} could not be scored (infrastructure "
                               f"failure, above); fix the cause, then `openrebench score {run.path}`")


def log_table(run: Run, rows: list[ScoreRow]) -> Table:
    table = Table(title=f"{run.info.env_id} ({run.info.tier}) — {run.path}")
    for col in ("#", "elapsed", "kind", "raw", "normalised", "message"):
        table.add_column(col, justify="right" if col in ("#", "elapsed", "raw", "normalised") else "left")
    for r in rows:
        table.add_row(str(r.index), f"{r.elapsed_s / 60:.1f} min", r.kind + ("" if r.charged else " (free)"),
                      fmt(r.raw), fmt(r.normalised, 3), first_clause(r.message),
                      style=None if r.valid else "red")
    return table


def first_clause(message: str, limit: int = 120) -> str:
    """A row's message in the log table: its first clause (the whole message is in score_log.jsonl
    and was printed when it was scored), so a table stays readable in 80 columns."""
    line = (message.splitlines() or [""])[0]
    clause = line.split("; ", 1)[0]
    text = clause if clause == line else clause + " …"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def duration(text: str) -> float:
    """'90s', '30m', '2h', '1d' or plain seconds -> seconds, within the range the harness allows."""
    from openrebench.harness import TIME_LIMIT_RANGE, check_time_limit

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise OpenRebenchError(f"bad --time-limit '{text}' (use e.g. 90s, 30m, 2h; from "
                               f"{TIME_LIMIT_RANGE})") from None
    return check_time_limit(seconds, f"--time-limit {text}")


SHIP_HINT = "ship from a checkout installed with `pip install -e .`"


def check_ship_target(folder: Path, what: str, hint: str = SHIP_HINT) -> None:
    """`--ship` writes into an environment's source: refuse an installed copy (under site-packages or
    dist-packages), where the file would be lost at the next install and shipped to no one, then check
    that the folder can be written."""
    if {"site-packages", "dist-packages"} & set(folder.absolute().parts):
        raise OpenRebenchError(f"{what} {folder} is an installed copy of the package, not its source: "
                               f"--ship writes where the package is built from; {hint}")
    check_writable(folder, what, hint)


def check_writable(folder: Path, what: str, hint: str = "") -> None:
    """Fail before a long measurement, not after it, when `folder` cannot be written, as an installed
    package's folder often cannot (the folder need not exist yet: its nearest existing parent is tried)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = None if existing.is_dir() else "not a folder"
    if problem is None:
        try:
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as e:
            problem = e.strerror or type(e).__name__
    if problem is None and not os.access(existing, os.W_OK):
        problem = "permission denied"
    if problem:
        raise OpenRebenchError(f"{what} {folder} cannot be written ({existing}: {problem.lower()})"
                               + (f"; {hint}" if hint else ""))


def models_access(env_id: str, tier: str, overrides: dict[str, str] | None = None) -> ScoringAccessFn | None:
    """Where the tier declares models, the scorer's way to them (the tier's defaults, `overrides`
    applied) through the harness's gateway, served by this process while it scores."""
    if not get_env(env_id).tier(tier).models:
        return None
    from openrebench.harness import RunModels

    models = RunModels.for_tier(get_env(env_id), tier, overrides)
    return models.scoring if models else None


def run_access(run: Run) -> ScoringAccessFn | None:
    """The scorer's way to the models the run was given (its gateway/grant.json), where it has any."""
    if not run.env.tier(run.info.tier).models:
        return None
    from openrebench.harness import RunModels

    models = RunModels.of_run(run)
    return models.scoring if models else None


def parse_env_models(pairs: list[str], env_ids: list[str], tier: str) -> dict[str, dict[str, str]]:
    """`--env-model ROLE=MODEL` values as each environment's overrides (an environment gets the roles
    its tier declares; a role that none of them declares is an error, in one line)."""
    wanted: dict[str, str] = {}
    for pair in pairs:
        role, sep, model = pair.partition("=")
        role, model = role.strip(), model.strip()
        if not sep or not role.isidentifier() or not model:
            raise OpenRebenchError(f"bad --env-model '{pair}' (use ROLE=MODEL, e.g. judge=openai/gpt-4o-mini "
                                   "or judge=local)")
        wanted[role] = model
    per_env = {e: {r: m for r, m in wanted.items() if r in get_env(e).tier(tier).models} for e in env_ids}
    if unknown := sorted(set(wanted) - {r for found in per_env.values() for r in found}):
        roles = sorted({r for e in env_ids for r in get_env(e).tier(tier).models})
        raise OpenRebenchError(f"--env-model: no environment chosen has the model role "
                               f"{', '.join(repr(r) for r in unknown)} in the {tier} tier (their roles: "
                               f"{', '.join(roles) or 'none'})")
    return per_env
