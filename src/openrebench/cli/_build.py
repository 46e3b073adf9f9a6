"""`openrebench build`: the data an environment ships that nobody writes by hand (a ground truth from
a sweep of training runs), computed by the environment's own `build_shipped` hook."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from openrebench.api import OpenRebenchError, cache_dir, show_progress

from ._common import (
    SHIP_HINT,
    TierOpt,
    check_ship_target,
    check_writable,
    console,
    err,
    get_env,
    user_errors,
)


@user_errors
def build(
    env_id: Annotated[str, typer.Argument(help="Environment id.")],
    tier: TierOpt = "mini",
    ship: Annotated[bool, typer.Option("--ship", help="Write into the environment's own folder, which the "
                                                      "package ships.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write into this folder, laid out as the environment's "
                                                  "(default: a folder in the openrebench cache).")] = None,
) -> None:
    """Compute the data an environment ships for a tier (e.g. a ground truth); resumes where it stopped."""
    env = get_env(env_id)
    env.tier(tier)
    if not env.builds_shipped_data:
        raise OpenRebenchError(f"{env.id} ships no built data (it has no build_shipped hook); its "
                               f"calibration records are written by `openrebench calibrate {env.id} --tier "
                               f"{tier} --ship`")
    if ship and out is not None:
        raise OpenRebenchError("give --ship or --out, not both")
    folder = env.root if ship else (out or cache_dir() / "built" / env.id).absolute()
    if ship:
        check_ship_target(folder, f"{env.id}'s folder", f"{SHIP_HINT}, or write elsewhere with --out DIR")
    else:
        check_writable(folder, "the output folder")
    folder.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["openrebench", *sys.argv[1:]])
    with err.status(f"Building {env.id}'s shipped data for the {tier} tier…"), show_progress(err):
        built = env.build_shipped(tier, folder, cache_dir(), command=command)
    for line in built.lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for path in built.files:
        console.print(f"written: {path}", highlight=False, soft_wrap=True)
    if not ship:
        console.print(f"to ship them, copy them into {env.root}, or build again with --ship (a build resumes "
                      "from its cache)", highlight=False, soft_wrap=True)
