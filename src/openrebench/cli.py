"""The `openrebench` command."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.table import Table

from openrebench.core import OpenRebenchError, Run, ScoreRow, final_score, show_progress

app = typer.Typer(help="Open, runnable RE-Bench: ML research-engineering environments.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

TierOpt = Annotated[str, typer.Option("--tier", "-t", help="mini (CPU) or full (GPU).")]
RunDir = Annotated[Path, typer.Argument(help="The run directory (or any folder inside it).")]


def _user_errors(fn: F) -> F:
    """Turn user-facing errors into one red line and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OpenRebenchError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _env(env_id: str):
    from openrebench.environments import get_environment

    return get_environment(env_id)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _score_with_status(run: Run, label: str, **kwargs: Any) -> ScoreRow:
    from openrebench.core import score_run

    with console.status(f"{label} (scoring runs in a separate process; this can take a while)…"):
        return score_run(run, **kwargs)


def _print_row(run: Run, row: ScoreRow) -> None:
    style = "green" if row.valid else "red"
    console.print(Panel(run.describe(row), title=f"score #{row.index}", border_style=style), highlight=False)


def _log_table(run: Run, rows: list[ScoreRow]) -> Table:
    table = Table(title=f"{run.info.env_id} ({run.info.tier}) — {run.path}")
    for col in ("#", "elapsed", "kind", "raw", "normalised", "message"):
        table.add_column(col, justify="right" if col in ("#", "elapsed", "raw", "normalised") else "left")
    for r in rows:
        table.add_row(str(r.index), f"{r.elapsed_s / 60:.1f} min", r.kind + ("" if r.charged else " (free)"),
                      _fmt(r.raw), _fmt(r.normalised, 3), r.message.splitlines()[0][:120],
                      style=None if r.valid else "red")
    return table


@app.command("list")
@_user_errors
def list_() -> None:
    """List the environments."""
    from openrebench.environments import ENVIRONMENTS

    table = Table(title="openrebench environments")
    for col in ("id", "RE-Bench task", "title", "tiers", "best"):
        table.add_column(col, no_wrap=col != "title")
    for cls in ENVIRONMENTS.values():
        table.add_row(cls.id, cls.rebench_id, cls.title, ", ".join(cls.tiers), cls.direction.value)
    console.print(table)


@app.command()
@_user_errors
def info(env_id: Annotated[str, typer.Argument(help="Environment id.")]) -> None:
    """Show an environment's tiers and normalisation constants."""
    from openrebench.core import constants_for

    env = _env(env_id)
    console.print(f"[bold]{env.id}[/] — {env.title}  (RE-Bench: {env.rebench_id}, version {env.version})")
    console.print(f"final score: {env.direction.value} valid row; score visible to the agent: "
                  f"{env.score_visible}")
    for spec in env.tiers.values():
        table = Table(title=f"tier {spec.name}: {spec.description}", show_header=False)
        table.add_row("hardware", spec.hardware)
        table.add_row("time limit", f"{spec.time_limit_hours:g} h")
        table.add_row("scoring limits", f"{spec.score_timeout_s:g} s, {spec.memory_limit_gb:g} GB")
        table.add_row("params", ", ".join(f"{k}={v}" for k, v in spec.params.items()))
        c = constants_for(env, spec.name)
        table.add_row("constants here", f"start {c.start:.4f}, reference {c.reference:.4f} ({c.source})")
        if spec.paper_constants:
            p = spec.paper_constants
            table.add_row("paper", f"start {p.start:.4f}, reference {p.reference:.4f} ({p.source})")
        console.print(table)


@app.command()
@_user_errors
def start(
    env_id: Annotated[str, typer.Argument(help="Environment id (see `openrebench list`).")],
    directory: Annotated[Path, typer.Argument(help="New run directory.")],
    tier: TierOpt = "mini",
    seed: Annotated[int | None, typer.Option(help="Seed for asset building (default: random).")] = None,
) -> None:
    """Set up a run: workspace, protected data, and the (uncharged) scoring of the starting solution."""
    from openrebench.core import start_run

    env = _env(env_id)
    env.tier(tier)
    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory, seed=seed)
        assert row is not None
    console.print(Markdown(env.instructions(tier)))
    _print_row(run, row)
    console.print(f"\nWorkspace: [bold]{run.workspace}[/]\nScore with: openrebench score {run.path}")


@app.command()
@_user_errors
def score(directory: RunDir = Path(".")) -> None:
    """Score the run's current solution and append the result to its score log."""
    run = Run.open(directory)
    _print_row(run, _score_with_status(run, "Scoring"))


@app.command()
@_user_errors
def log(directory: RunDir = Path(".")) -> None:
    """Show the score log."""
    run = Run.open(directory)
    rows, warnings = run.rows()
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}")
    console.print(_log_table(run, rows))


@app.command()
@_user_errors
def result(directory: RunDir = Path(".")) -> None:
    """Show the run's final raw and normalised score."""
    from openrebench.core import final_row

    run = Run.open(directory)
    env = _env(run.info.env_id)
    rows, _ = run.rows()
    raw, norm = final_score(rows, env.direction, run.info.constants)
    row = final_row(rows, env.direction)
    which = "no valid score" if row is None else f"row #{row.index} ({env.direction.value} valid row)"
    console.print(f"final raw score: [bold]{_fmt(raw)}[/]   normalised: [bold]{norm:.3f}[/]   from {which}")
    console.print(f"normalisation: start {run.info.constants.start:.4f}, reference "
                  f"{run.info.constants.reference:.4f} ({run.info.constants.source})", highlight=False)


@app.command()
@_user_errors
def calibrate(
    env_id: Annotated[str, typer.Argument(help="Environment id.")],
    tier: TierOpt = "mini",
    repeats: Annotated[int, typer.Option(min=1, help="Scorings of each solution.")] = 5,
    out: Annotated[Path | None, typer.Option(help="Also write the record into this folder.")] = None,
) -> None:
    """Score the starting and reference solutions N times on this machine; save a calibration record."""
    from rich.progress import Progress

    from openrebench.core import calibrate_environment, save_record
    from openrebench.core._calibration import user_calibration_dir

    env = _env(env_id)
    env.tier(tier)
    with Progress(console=console) as progress, show_progress(console):
        task = progress.add_task(f"calibrating {env_id} ({tier})", total=2 * repeats)

        def on_progress(which: str, i: int, raw: float | None, message: str) -> None:
            progress.advance(task)
            progress.console.print(f"  {which} #{i}: {_fmt(raw) if raw is not None else message}",
                                   highlight=False)

        record = calibrate_environment(env_id, tier, repeats, on_progress=on_progress,
                                       command=shlex.join(["openrebench", *sys.argv[1:]]))
    table = Table(title=f"{env_id} ({tier}) on {record.hardware_key}")
    for col in ("solution", "n", "mean", "median", "sd", "CV"):
        table.add_column(col, justify="right")
    for which, stats in (("start", record.start), ("reference", record.reference)):
        table.add_row(which, str(len(stats.values)), f"{stats.mean:.4f}", f"{stats.median:.4f}",
                      f"{stats.sd:.4f}", f"{stats.cv:.2%}")
    console.print(table)
    if record.invalid:
        err.print(f"[yellow]warning:[/] invalid scorings: {record.invalid}")
    path = save_record(record, user_calibration_dir(env.id))
    console.print(f"record written to {path}; runs started on this hardware now normalise with it")
    if out:
        console.print(f"record also written to {save_record(record, out)}")


@app.command()
@_user_errors
def demo(
    env_id: Annotated[str, typer.Argument(help="Environment id.")] = "optimize_kernel",
    tier: TierOpt = "mini",
    directory: Annotated[Path | None, typer.Option("--dir", help="Run directory (default: a new one "
                                                                 "under ./runs).")] = None,
) -> None:
    """End to end: start a run, score the start, put the reference in place, score it, show the log."""
    import time

    env = _env(env_id)
    env.tier(tier)
    directory = directory or Path("runs") / f"demo-{env_id}-{tier}-{time.strftime('%Y%m%d-%H%M%S')}"
    from openrebench.core import start_run

    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory)
        assert row is not None
    _print_row(run, row)
    env.install_reference(run.workspace, tier)
    console.print("Reference solution put in place of the agent's.")
    _print_row(run, _score_with_status(run, "Scoring the reference solution"))
    rows, _ = run.rows()
    console.print(_log_table(run, rows))
    raw, norm = final_score(rows, env.direction, run.info.constants)
    console.print(f"final: raw {_fmt(raw)}, normalised [bold]{norm:.3f}[/] "
                  f"(constants: {run.info.constants.source})", highlight=False)


def _duration(text: str) -> float:
    """'90s', '30m', '2h' or plain seconds -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise OpenRebenchError(f"bad duration '{text}' (use e.g. 90s, 30m, 2h)") from None


@app.command("eval")
@_user_errors
def eval_(
    env_ids: Annotated[list[str], typer.Argument(help="Environment ids, or 'all'.")],
    tier: TierOpt = "mini",
    agent: Annotated[str, typer.Option(help="oracle (no model), react or human.")] = "oracle",
    model: Annotated[str | None, typer.Option(help="Inspect model, e.g. openai/gpt-4o.")] = None,
    time_limit: Annotated[str | None, typer.Option(help="Working time per run, e.g. 30m (default: "
                                                         "the tier's).")] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Runs per environment.")] = 1,
    log_dir: Annotated[Path, typer.Option(help="Where Inspect writes its logs.")] = Path("logs"),
    runs_dir: Annotated[Path, typer.Option(help="Where run directories go.")] = Path("runs"),
    isolation: Annotated[str, typer.Option(help="auto (bwrap where it starts, else local with a "
                                                "warning), bwrap, or local (no isolation).")] = "auto",
    retry_attempts: Annotated[int, typer.Option(min=0, help="Retry failed tasks this many times, "
                                                             "resuming from the logs (Inspect's eval_set)."
                                                )] = 0,
    resume: Annotated[bool, typer.Option(help="Reuse finished work in --log-dir (Inspect's eval_set): "
                                              "only what is missing or failed runs again.")] = False,
    max_samples: Annotated[int | None, typer.Option(help="Attempts run at once.")] = None,
    display: Annotated[str | None, typer.Option(help="Inspect's progress display: full, rich, plain, "
                                                     "none (default: Inspect's).")] = None,
) -> None:
    """Run agents on environments through Inspect AI, then print a results table."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai import eval_set

    from openrebench.environments import ENVIRONMENTS
    from openrebench.harness import TASKS

    ids = list(ENVIRONMENTS) if env_ids == ["all"] else env_ids
    for env_id in ids:
        _env(env_id).tier(tier)
    if agent not in ("oracle", "react", "human"):
        raise OpenRebenchError(f"unknown agent '{agent}' (known: oracle, react, human)")
    if isolation not in ("auto", "bwrap", "local"):
        raise OpenRebenchError(f"unknown isolation '{isolation}' (known: auto, bwrap, local)")
    if isolation == "bwrap":
        from openrebench.core import bwrap_usable

        if problem := bwrap_usable():
            raise OpenRebenchError(f"--isolation bwrap: {problem}")
    if agent == "react" and model is None:
        raise OpenRebenchError("the react agent needs --model")
    seconds = _duration(time_limit) if time_limit else None
    tasks = [TASKS[e](tier=tier, agent=agent, time_limit=seconds, runs_dir=str(runs_dir.resolve()),
                      isolation=isolation) for e in ids]
    options = {"model": model or "mockllm/model", "epochs": epochs, "log_dir": str(log_dir),
               "max_samples": max_samples, "display": display}
    if retry_attempts or resume:
        _, logs = eval_set(tasks, retry_attempts=retry_attempts, **options)  # type: ignore[arg-type]
    else:
        logs = inspect_eval(tasks, **options)  # type: ignore[arg-type]
    table = Table(title=f"openrebench eval — {agent} on {tier}")
    for col in ("environment", "epoch", "normalised", "raw", "run"):
        table.add_column(col, justify="right" if col in ("epoch", "normalised", "raw") else "left")
    for log in logs:
        if log.status != "success" or not log.samples:
            reason = log.error.message if log.error else log.status
            table.add_row(log.eval.task, "—", "error", "—", str(reason))
            continue
        for sample in log.samples:
            for score in (sample.scores or {}).values():
                meta = score.metadata or {}
                table.add_row(log.eval.task, str(sample.epoch), f"{float(score.value):.3f}",
                              _fmt(meta.get("raw")), str(meta.get("run_dir", "")))
    console.print(table)
    console.print(f"Inspect logs: {log_dir} (open them with `inspect view --log-dir {log_dir}`)")


from openrebench._cli_analysis import add_analysis_commands  # noqa: E402

add_analysis_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
