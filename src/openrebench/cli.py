"""The `openrebench` command."""

from __future__ import annotations

import functools
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from openrebench.api import OpenRebenchError, show_progress
from openrebench.runs import Run, ScoreRow, final_score

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
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _env(env_id: str):
    from openrebench.runs import get_environment

    return get_environment(env_id)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _score_with_status(run: Run, label: str, **kwargs: Any) -> ScoreRow:
    from openrebench.runs import score_run

    with console.status(f"{label} (scoring runs in a separate process; this can take a while)…"):
        return score_run(run, **kwargs)


def _print_row(run: Run, row: ScoreRow) -> None:
    style = "green" if row.valid else "red"
    console.print(Panel(run.describe(row), title=f"score #{row.index}", border_style=style), highlight=False)
    if row.details.get("infrastructure"):
        cause = row.details.get("error") or str(row.details.get("scorer_stderr", "")).strip()[-600:]
        err.print(f"[yellow]infrastructure failure, not the solution's:[/] row #{row.index} of "
                  f"{run.score_log_path}" + (f"\n{cause}" if cause else ""), highlight=False, soft_wrap=True)


def _log_table(run: Run, rows: list[ScoreRow]) -> Table:
    table = Table(title=f"{run.info.env_id} ({run.info.tier}) — {run.path}")
    for col in ("#", "elapsed", "kind", "raw", "normalised", "message"):
        table.add_column(col, justify="right" if col in ("#", "elapsed", "raw", "normalised") else "left")
    for r in rows:
        table.add_row(str(r.index), f"{r.elapsed_s / 60:.1f} min", r.kind + ("" if r.charged else " (free)"),
                      _fmt(r.raw), _fmt(r.normalised, 3), _first_clause(r.message),
                      style=None if r.valid else "red")
    return table


def _first_clause(message: str, limit: int = 120) -> str:
    """A row's message in the log table: its first clause (the whole message is in score_log.jsonl
    and was printed when it was scored), so a table stays readable in 80 columns."""
    line = (message.splitlines() or [""])[0]
    clause = line.split("; ", 1)[0]
    text = clause if clause == line else clause + " …"
    return text if len(text) <= limit else text[:limit - 1] + "…"


@app.command("list")
@_user_errors
def list_() -> None:
    """List the environments."""
    from openrebench.runs import environment_classes

    table = Table(title="openrebench environments")
    for col in ("id", "the job (RE-Bench task)", "tiers", "best"):
        table.add_column(col, no_wrap=col != "the job (RE-Bench task)")
    for cls in environment_classes().values():
        job = f"{cls.title} [dim]({cls.rebench_id})[/]"
        table.add_row(cls.id, job, ", ".join(cls.tiers), cls.direction.value)
    console.print(table)


@app.command()
@_user_errors
def info(env_id: Annotated[str, typer.Argument(help="Environment id.")]) -> None:
    """Show an environment's tiers and normalisation constants."""
    from openrebench.runs import constants_for

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
    from openrebench.runs import start_run

    env = _env(env_id)
    env.tier(tier)
    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory, seed=seed)
        assert row is not None
    console.print(Markdown(env.instructions(tier)))
    _print_row(run, row)
    _print_constants(run)
    console.print(f"\nWorkspace: [bold]{run.workspace}[/]\nScore with: openrebench score {run.path}")
    _fail_on_setup_infrastructure(run, row)


def _print_constants(run: Run) -> None:
    c = run.info.constants
    console.print(f"normalisation: start {c.start:.4f}, reference {c.reference:.4f} ({c.source})",
                  highlight=False, soft_wrap=True)


def _fail_on_setup_infrastructure(run: Run, row: ScoreRow) -> None:
    """The starting solution could not be scored for the harness's own reason: the run is set up but
    has no baseline, so say so and exit non-zero (after fixing the cause: `openrebench score DIR`)."""
    if row.details.get("infrastructure"):
        raise OpenRebenchError(f"the starting solution of {run.path} could not be scored (infrastructure "
                               f"failure, above); fix the cause, then `openrebench score {run.path}`")


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
    from openrebench.runs import final_row

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

    from openrebench.runs import calibrate_environment, save_record
    from openrebench.runs._calibration import user_calibration_dir

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
    stamp = time.strftime("%Y%m%d-%H%M%S")
    directory = (directory or Path("runs") / f"demo-{env_id}-{tier}-{stamp}").absolute()
    from openrebench.runs import install_reference, start_run

    with err.status(f"Setting up {env_id} ({tier}) and scoring the starting solution…"), show_progress(err):
        run, row = start_run(env_id, tier, directory)
        assert row is not None
    _print_row(run, row)
    _print_constants(run)
    _fail_on_setup_infrastructure(run, row)
    install_reference(run)
    console.print("Reference solution put in place of the agent's.")
    _print_row(run, _score_with_status(run, "Scoring the reference solution"))
    rows, _ = run.rows()
    console.print(_log_table(run, rows))
    raw, norm = final_score(rows, env.direction, run.info.constants)
    console.print(f"final: raw {_fmt(raw)}, normalised [bold]{norm:.3f}[/] "
                  f"(constants: {run.info.constants.source})", highlight=False)


def _duration(text: str) -> float:
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


def _check_gpus(env_ids: list[str], tier: str) -> None:
    """Fail before Inspect starts when a tier needs more GPUs than the pool attempts lease from
    (OPENREBENCH_GPUS) holds. (A machine without the GPU at all is refused when the task is made.)"""
    from openrebench.isolation import visible_gpus

    for env_id in env_ids:
        spec = _env(env_id).tier(tier)
        if spec.gpu_count > (have := len(visible_gpus())):
            raise OpenRebenchError(f"{env_id} ({tier}) needs {spec.gpu_count} GPU(s); the pool holds {have} "
                                   "(OPENREBENCH_GPUS)")


def _one_line(error: Any) -> str:
    """One line for an Inspect error: the exception as its traceback's last line states it (the message
    alone is a repr that can drop the detail), without the exception's module path."""
    lines = [x.strip() for x in (error.traceback or "").splitlines() if x.strip()]
    if lines and re.match(r"[\w.]+(: |$)", lines[-1]):
        line = lines[-1]
    else:
        line = next((x.strip() for x in error.message.splitlines() if x.strip()), "no message")
        if m := re.fullmatch(r"(\w+)\((['\"])(.*)\2\)", line):  # OpenRebenchError('...')
            line = f"{m[1]}: {m[3]}"
    return re.sub(r"^(?:\w+\.)+(?=\w+(: |$))", "", line)[:200]


def _failures(logs: list[Any], task_names: list[str]) -> list[tuple[str, str, str]]:
    """(what, status, one-line reason) for each sample that errored or has no score, each eval that did
    not succeed where no sample says why (an eval can succeed while one of its samples failed), and each
    task without a log: on Ctrl-C Inspect writes the cancelled logs but returns none of them."""
    returned = {log.eval.task for log in logs}
    out = [(name, "cancelled", "interrupted (its log in --log-dir says how far it got)")
           for name in dict.fromkeys(task_names) if name not in returned]
    for log in logs:
        task = log.eval.task
        samples: list[tuple[str, str, str]] = []
        for sample in log.samples or []:
            where = f"{task} (epoch {sample.epoch})"
            if sample.error is not None:
                samples.append((where, "error", _one_line(sample.error)))
            elif not sample.scores:
                reason = f"{sample.limit.type} limit hit" if sample.limit else "the sample was not scored"
                samples.append((where, "unscored", reason))
        if log.status != "success" and not samples:
            reason = {"cancelled": "interrupted", "started": "did not finish"}.get(log.status, "no samples")
            samples.append((task, log.status, _one_line(log.error) if log.error else reason))
        out.extend(samples)
    return out


def _exit_code(failures: list[tuple[str, str, str]]) -> int:
    """130 when an eval was interrupted (as a shell reports Ctrl-C), 1 when anything failed, else 0."""
    if any(status == "cancelled" for _, status, _ in failures):
        return 130
    return 1 if failures else 0


def _inspect_command() -> str:
    """`inspect` as a command that works as printed: the one beside this Python (the virtual
    environment's, even when it is not activated), else whatever `inspect` is on the PATH."""
    exe = Path(sys.executable).parent / "inspect"
    return shlex.quote(str(exe)) if exe.is_file() else "inspect"


@app.command("eval")
@_user_errors
def eval_(
    env_ids: Annotated[list[str], typer.Argument(help="Environment ids, or 'all'.")],
    tier: TierOpt = "mini",
    agent: Annotated[str, typer.Option(help="oracle (no model), react or human.")] = "oracle",
    model: Annotated[str | None, typer.Option(help="Inspect model, e.g. openai/gpt-4o.")] = None,
    time_limit: Annotated[str | None, typer.Option(help="Working time per run, e.g. 30m, 2h or seconds, "
                                                         "from 1m to 7d (default: the tier's).")] = None,
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
    message_limit: Annotated[str | None, typer.Option(help="Messages per attempt (react default: 300 per "
                                                           "hour of working time, at least 40).")] = None,
    token_limit: Annotated[str | None, typer.Option(help="Tokens per attempt, e.g. 500k or 2M (react "
                                                         "default: 2M per hour of working time).")] = None,
    prices: Annotated[Path | None, typer.Option(help="JSON of US$ per 1M tokens by model for the cost "
                                                     'estimate: {"openai/gpt-4o": {"input": 2.5, '
                                                     '"output": 10}}.')] = None,
    max_cost: Annotated[float, typer.Option(help="Stop before a react run whose cost bound (US$) is "
                                                 "above this, unless --yes.")] = 50.0,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Run even above --max-cost.")] = False,
) -> None:
    """Run agents on environments through Inspect AI, then print a results table.

    Exits 1 when an attempt fails or ends without a score (listed after the table), 130 when interrupted.
    """
    from inspect_ai import eval as inspect_eval
    from inspect_ai import eval_set

    from openrebench.harness import (
        AGENTS,
        ISOLATIONS,
        check_client,
        check_credentials,
        ended,
        environment_tasks,
        estimate_run,
        results_caption,
    )
    from openrebench.runs import environment_classes

    ids = list(environment_classes()) if env_ids == ["all"] else env_ids
    for env_id in ids:
        _env(env_id).tier(tier)
    if agent not in AGENTS:
        raise OpenRebenchError(f"unknown agent '{agent}' (known: {', '.join(AGENTS)})")
    if isolation not in ISOLATIONS:
        raise OpenRebenchError(f"unknown isolation '{isolation}' (known: {', '.join(ISOLATIONS)})")
    if isolation == "bwrap":
        from openrebench.isolation import bwrap_usable

        if problem := bwrap_usable():
            raise OpenRebenchError(f"--isolation bwrap: {problem}")
    if agent == "react" and model is None:
        raise OpenRebenchError("the react agent needs --model")
    if model is not None:
        check_client(model)
    seconds = _duration(time_limit) if time_limit else None
    # Making the tasks checks their arguments and the machine (nothing is set up yet).
    made = environment_tasks()
    tasks = [made[e](tier=tier, agent=agent, time_limit=seconds, runs_dir=str(runs_dir.resolve()),
                     isolation=isolation, message_limit=message_limit, token_limit=token_limit) for e in ids]
    _check_gpus(ids, tier)
    if agent == "react" and model is not None:
        estimate = estimate_run(model, ids, tier, seconds, epochs, message_limit, token_limit, prices)
        console.print("\n".join(estimate.lines()), highlight=False, markup=False)
        estimate.check(max_cost, yes)
    if model is not None:
        check_credentials(model)
    # "none" is Inspect's no-model model: the oracle and human agents call none, and the display says so.
    options = {"model": model or "none", "epochs": epochs, "log_dir": str(log_dir),
               "max_samples": max_samples, "display": display}
    if retry_attempts or resume:
        _, logs = eval_set(tasks, retry_attempts=retry_attempts, **options)  # type: ignore[arg-type]
    else:
        logs = inspect_eval(tasks, **options)  # type: ignore[arg-type]
    table = Table(title=f"openrebench eval — {agent} on {tier}", caption=results_caption(logs),
                  caption_justify="left")
    for col in ("environment", "epoch", "normalised", "raw", "ended", "run"):
        table.add_column(col, justify="right" if col in ("epoch", "normalised", "raw") else "left")
    for log in logs:
        for sample in log.samples or []:
            for score in (sample.scores or {}).values():
                meta = score.metadata or {}
                table.add_row(log.eval.task, str(sample.epoch), f"{float(score.value):.3f}",
                              _fmt(meta.get("raw")), ended(sample), str(meta.get("run_dir", "")))
    if table.rows:
        console.print(table)
    failures = _failures(logs, [t.name for t in tasks])
    for what, status, reason in failures:
        err.print(f"[bold red]{status}:[/] {what}: {reason}", highlight=False, soft_wrap=True)
    console.print(f"Inspect logs: {log_dir} (open them with `{_inspect_command()} view --log-dir "
                  f"{shlex.quote(str(log_dir))}`)", highlight=False, soft_wrap=True)
    if code := _exit_code(failures):
        raise typer.Exit(code)


from openrebench._cli_analysis import add_analysis_commands  # noqa: E402

add_analysis_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
