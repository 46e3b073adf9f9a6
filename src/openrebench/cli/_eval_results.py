"""What `openrebench eval` prints after the attempts: the results table (an attempt per row), where each
environment's constants came from, the total time, the failures one line each, and its exit code."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from openrebench.api import describe_duration

from ._common import console, err, fmt

# Exceptions that only wrap the one that failed: Inspect's retries (tenacity) end in a RetryError whose
# text names no cause ("RetryError[<Future … raised APIConnectionError>]").
WRAPPERS = re.compile(r"(?:tenacity\.)?RetryError\b")


def _exceptions(traceback: str) -> list[str]:
    """The exception lines of a traceback, the first cause first (each traceback of a chain ends with
    one, not indented: the code lines are); none where the last line is not one."""
    lines = [x.rstrip() for x in traceback.splitlines() if x.strip()]
    found = [x for x in lines if x[:1].strip() and re.match(r"[\w.]+(: |$)", x)]
    return found if found and found[-1] == lines[-1] else []


def one_line(error: Any) -> str:
    """One line for an Inspect error: the exception as its traceback's last line states it (the message
    alone is a repr that can drop the detail), without the exception's module path. Where that is a
    retry's wrapper, the exception it wraps instead, with the first cause (a model provider that cannot
    be reached: `APIConnectionError: Connection error. (ConnectError: All connection attempts failed)`)."""
    found = _exceptions(error.traceback or "")
    if len(found) > 1 and WRAPPERS.match(found[-1]):
        line = found[-2] + (f" ({_short_name(found[0])})" if len(found) > 2 else "")
    elif found:
        line = found[-1]
    else:
        line = next((x.strip() for x in error.message.splitlines() if x.strip()), "no message")
        if m := re.fullmatch(r"(\w+)\((['\"])(.*)\2\)", line):  # OpenRebenchError('...')
            line = f"{m[1]}: {m[3]}"
    return _short_name(line)[:200]


def _short_name(line: str) -> str:
    """An exception line without the exception's module path."""
    return re.sub(r"^(?:\w+\.)+(?=\w+(: |$))", "", line)


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def _task_time(log: Any) -> str:
    """A task's wall time from its log: its set-up, every attempt and scoring (its samples run at once)."""
    from datetime import datetime

    stats = log.stats
    try:
        began, done = datetime.fromisoformat(stats.started_at), datetime.fromisoformat(stats.completed_at)
    except (TypeError, ValueError, AttributeError):
        return ""
    return minutes((done - began).total_seconds())


def failures(logs: list[Any], task_names: list[str]) -> list[tuple[str, str, str]]:
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
                samples.append((where, "error", one_line(sample.error)))
            elif not sample.scores:
                reason = f"{sample.limit.type} limit hit" if sample.limit else "the sample was not scored"
                samples.append((where, "unscored", reason))
        if log.status != "success" and not samples:
            reason = {"cancelled": "interrupted", "started": "did not finish"}.get(log.status, "no samples")
            samples.append((task, log.status, one_line(log.error) if log.error else reason))
        out.extend(samples)
    return out


def exit_code(found: list[tuple[str, str, str]]) -> int:
    """130 when an eval was interrupted (as a shell reports Ctrl-C), 1 when anything failed, else 0."""
    if any(status == "cancelled" for _, status, _ in found):
        return 130
    return 1 if found else 0


def _inspect_command() -> str:
    """`inspect` as a command that works as printed: the one beside this Python (the virtual
    environment's, even when it is not activated), else whatever `inspect` is on the PATH."""
    exe = Path(sys.executable).parent / "inspect"
    return shlex.quote(str(exe)) if exe.is_file() else "inspect"


def report(logs: list[Any], ids: list[str], tasks: list[Any], title: str, seconds: float, log_dir: Path, *,
           campaign: bool) -> None:
    """The results table, the total time, the failures (one line each) and where the logs are; exits 1 on
    a failed or unscored attempt, 130 when interrupted."""
    print_results(logs, ids, title, campaign=campaign)
    took, count = minutes(seconds), f"{len(tasks)} task{'s' * (len(tasks) != 1)}"
    console.print(f"Total: {count} in {took} (set-ups, attempts and scorings; each task's own in the time "
                  "column)", highlight=False)
    found = failures(logs, [t.name for t in tasks])
    for what, status, reason in found:
        err.print(f"[bold red]{status}:[/] {what}: {reason}", highlight=False, soft_wrap=True)
    console.print(f"Inspect logs: {log_dir} (open them with `{_inspect_command()} view --log-dir "
                  f"{shlex.quote(str(log_dir))}`)", highlight=False, soft_wrap=True)
    if code := exit_code(found):
        raise typer.Exit(code)


def print_results(logs: list[Any], ids: list[str], title: str, *, campaign: bool) -> None:
    """The results table (an attempt per row), where each environment's constants came from, and a
    warning for attempts that ran unisolated."""
    from openrebench.harness import ended, results_caption
    from openrebench.runs import ScoreMetadata

    table = Table(title=title, caption=results_caption(logs), caption_justify="left")
    for col in ("environment", *(("time limit",) if campaign else ()), "epoch", "normalised", "raw", "ended",
                "time", "run"):
        # The environment's name whole (the run's path folds instead, at any terminal width).
        whole = col == "environment"
        table.add_column(col, justify="left" if col in ("environment", "ended", "run") else "right",
                         no_wrap=whole, min_width=max(map(len, ids)) if whole else None,
                         overflow="fold" if col == "run" else "ellipsis")
    unisolated = 0
    sources: dict[str, set[str]] = {}  # each environment's normalisation constants, where they come from
    for log in logs:
        for sample in log.samples or []:
            for score in (sample.scores or {}).values():
                meta = ScoreMetadata.read(score.metadata, log.location or log.eval.task)
                if meta.constants_source:
                    sources.setdefault(log.eval.task, set()).add(meta.constants_source)
                value = f"{float(score.value):.3f}"
                if meta.isolated is False:  # a measurement of nothing: said where it is read
                    value, unisolated = f"{value} UNISOLATED", unisolated + 1
                limit = getattr(log.eval.config, "working_limit", None)  # as the caption reads it
                table.add_row(log.eval.task, *((describe_duration(float(limit)) if limit else "tier's",)
                                               if campaign else ()),
                              str(sample.epoch), value, fmt(meta.raw), ended(sample),
                              _task_time(log), meta.run_dir or "")
    if table.rows:
        console.print(table)
    for task, said in sorted(sources.items()):  # a self-calibrated machine or a default says so here
        console.print(f"{task} normalised with: {'; '.join(sorted(said))}", highlight=False, soft_wrap=True)
    if unisolated:
        err.print(f"[bold red]warning:[/] {unisolated} attempt(s) ran with --isolation none: nothing was "
                  "isolated, so their scores measure nothing", highlight=False, soft_wrap=True)

