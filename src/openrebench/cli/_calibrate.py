"""`openrebench calibrate`: the one writer of calibration records, for this user (always) and, with
`--ship`, for everyone who installs the package."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from openrebench.api import show_progress
from openrebench.base import cache_dir
from openrebench.runs import calibrate_environment

from ._common import (
    TierOpt,
    check_ship_target,
    console,
    err,
    fmt,
    get_env,
    models_access,
    parse_env_models,
    user_errors,
)


@user_errors
def calibrate(
    env_id: Annotated[str, typer.Argument(help="Environment id.")],
    tier: TierOpt = "mini",
    repeats: Annotated[int, typer.Option(min=1, help="Scorings of each solution.")] = 5,
    out: Annotated[Path | None, typer.Option(help="Also write the record into this folder.")] = None,
    env_model: Annotated[list[str] | None, typer.Option(
        help="The model of one of the environment's model roles, ROLE=MODEL (repeatable): the record is "
             "these models' (runs given the same models use it).")] = None,
    ship: Annotated[bool, typer.Option(
        "--ship", help="Also write the record into the environment's calibration/ folder, which the package "
                       "ships.")] = False,
    probe_repeats: Annotated[int, typer.Option(
        min=0, help="Scorings of each of the environment's probes (solutions that game the scorer without "
                    "doing the task, e.g. chat_rl's question-independent answers); 0: none.")] = 1,
) -> None:
    """Score the starting and reference solutions N times on this machine, and the environment's probes;
    save a calibration record."""
    from rich.progress import Progress

    from openrebench.runs import save_record, shipped_calibration_dir, user_calibration_dir

    env = get_env(env_id)
    env.tier(tier)
    overrides = parse_env_models(env_model or [], [env_id], tier)[env_id]
    shipped = shipped_calibration_dir(env)
    if ship:  # before minutes of scoring, not after
        check_ship_target(shipped, f"{env.id}'s calibration folder")
    with Progress(console=console) as progress, show_progress(console):
        n_probes = len(env.probes(tier, cache_dir())) if probe_repeats else 0
        task = progress.add_task(f"calibrating {env_id} ({tier})",
                                 total=2 * repeats + n_probes * probe_repeats)

        def on_progress(which: str, i: int, raw: float | None, message: str) -> None:
            progress.advance(task)
            progress.console.print(f"  {which} #{i}: {fmt(raw) if raw is not None else message}",
                                   highlight=False)

        record = calibrate_environment(env_id, tier, repeats, on_progress=on_progress,
                                       command=shlex.join(["openrebench", *sys.argv[1:]]),
                                       access=models_access(env_id, tier, overrides), models=overrides,
                                       probe_repeats=probe_repeats)
    table = Table(title=f"{env_id} ({tier}) on {record.hardware_key}")
    for col in ("solution", "n", "mean", "median", "sd", "CV"):
        table.add_column(col, justify="right")
    rows = [("start", record.start), ("reference", record.reference),
            *((f"probe: {name}", stats) for name, stats in record.probes.items())]
    for which, stats in rows:
        table.add_row(which, str(len(stats.values)), f"{stats.mean:.4f}", f"{stats.median:.4f}",
                      f"{stats.sd:.4f}", f"{stats.cv:.2%}")
    console.print(table)
    sign = 1 if env.direction == "max" else -1
    gamed = [name for name, stats in record.probes.items()
             if sign * (stats.median - record.start.median) >= 0]
    if gamed:
        err.print(f"[bold red]warning:[/] probes that do not do the task scored at or beyond the start: "
                  f"{', '.join(gamed)} (the scorer can be gamed this way)")
    if record.invalid:
        err.print(f"[yellow]warning:[/] invalid scorings: {record.invalid}")
    path = save_record(record, user_calibration_dir(env.id))
    console.print(f"record written to {path}; runs started on this hardware now normalise with it")
    if out:
        console.print(f"record also written to {save_record(record, out)}")
    if ship:
        console.print(f"record shipped in {save_record(record, shipped)} (the package's copy for this "
                      "hardware: commit it)", highlight=False, soft_wrap=True)
        default = env.tier(tier).calibration
        if default is not None and not default.is_file():  # a new tier's first record: its default too
            written = save_record(record, default.parent, default.name)
            console.print(f"and as the tier's default record, {written} (what machines without a "
                          "record of their own normalise with: commit it)",
                          highlight=False, soft_wrap=True)
