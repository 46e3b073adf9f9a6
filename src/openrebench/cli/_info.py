"""`openrebench list` and `openrebench info`: what environments there are, and one in detail."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ._common import console, get_env, user_errors


@user_errors
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


@user_errors
def info(env_id: Annotated[str, typer.Argument(help="Environment id.")]) -> None:
    """Show an environment's tiers, normalisation constants and model roles."""
    from openrebench.isolation import volume_problem
    from openrebench.runs import constants_for, detect_hardware, find_machine_record

    env = get_env(env_id)
    console.print(f"[bold]{env.id}[/] — {env.title}  (RE-Bench: {env.rebench_id}, version {env.version})")
    console.print(f"final score: {env.direction.value} valid row; score visible to the agent: "
                  f"{env.score_visible}")
    for spec in env.tiers.values():
        table = Table(title=f"tier {spec.name}: {spec.description}", show_header=False)
        table.add_row("hardware", spec.hardware)
        table.add_row("time limit", f"{spec.time_limit_hours:g} h")
        table.add_row("scoring limits", f"{spec.score_timeout_s:g} s, {spec.memory_limit_gb:g} GB")
        disk = spec.attempt_disk_bytes / 1024**3
        table.add_row("attempt disk", f"{disk:g} GB of its own (workspace, home, /tmp, /opt, /var/tmp)"
                      if volume_problem() is None else f"none here ({volume_problem()}): the machine's disk")
        table.add_row("params", ", ".join(f"{k}={v}" for k, v in spec.params.model_dump().items()))
        c = constants_for(env, spec.name)
        table.add_row("constants here", f"start {c.start:.4f}, reference {c.reference:.4f} ({c.source})")
        if spec.machine_dependent:
            fingerprint = detect_hardware().fingerprint(spec.device)
            mine = find_machine_record(env, spec.name, fingerprint)
            table.add_row("this machine", f"{fingerprint}: " + (
                f"calibrated ({mine[1]} record)" if mine else
                "not calibrated yet; the first run set up here calibrates it (the start and the reference, "
                "3 scorings each), once"))
        if spec.paper_constants:
            p = spec.paper_constants
            table.add_row("paper", f"start {p.start:.4f}, reference {p.reference:.4f} ({p.source})")
        for role, r in spec.models.items():
            table.add_row(f"model role {role}", f"{r.model} (default; --env-model {role}=MODEL): "
                                                f"{r.description}")
        if spec.models:
            b = spec.model_budget
            limits = [] if b is None else [*([f"${b.usd:g}"] if b.usd else []),
                                           *([f"{b.tokens:,} tokens"] if b.tokens else [])]
            cap = f"; each reply of the tier's own models at most {b.reply_tokens:,} tokens" \
                if b is not None and b.reply_tokens else ""
            table.add_row("model budget", (" and ".join(limits) + " per run" if limits else "none") + cap)
        console.print(table)
