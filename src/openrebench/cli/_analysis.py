"""`openrebench analyze` and `openrebench report`: score@k over time budgets, agents against humans."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from openrebench.api import OpenRebenchError

from ._common import console, err, user_errors

if TYPE_CHECKING:
    from openrebench.analysis import Analysis

Paths = Annotated[list[Path] | None, typer.Argument(
    help="Inspect log files or directories written by `openrebench eval` (searched recursively).",
    show_default=False)]
PaperOpt = Annotated[bool, typer.Option("--paper", help="Add the RE-Bench paper's human and agent data "
                                                         "(and, on its own, print its headline numbers).")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", help="Analyse only this environment "
                                                             "(repeatable).")]
BudgetsOpt = Annotated[str | None, typer.Option(help="Total budgets in hours, e.g. '2,8,32' (default: every "
                                                     "run length times powers of 2).")]
MaxBudgetOpt = Annotated[float, typer.Option(help="Largest default budget in hours.")]
BootsOpt = Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals.")]
SimsOpt = Annotated[int, typer.Option(help="Draws of k runs for the paper's sampling estimate.")]
SeedOpt = Annotated[int, typer.Option(help="Random seed (results are reproducible).")]
SkipOpt = Annotated[bool, typer.Option("--skip-incomplete", help=(
    "Leave out samples without a score (each is listed as a warning) instead of stopping."))]
PricesOpt = Annotated[Path | None, typer.Option(help=(
    "JSON of US$ per 1M tokens by model, for logs without Inspect's own cost (else the list-price "
    'table): {"openai/gpt-4o": {"input": 2.5, "output": 10}}.'))]
HumansOpt = Annotated[str, typer.Option("--human-rows", help=(
    "Paper human rows: 'real' (all 86) or 'likely71' (those likely among the paper's 71)."))]


def _budgets(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OpenRebenchError(f"bad --budgets '{text}' (use hours, e.g. 2,8,32)") from None
    if not values or any(v <= 0 for v in values):
        raise OpenRebenchError(f"bad --budgets '{text}' (hours must be positive)")
    return values


def build_analysis(paths: list[Path], paper: bool, envs: list[str] | None, budgets: str | None,
                   max_budget: float, boots: int, sims: int, seed: int, skip_incomplete: bool,
                   prices: Path | None, human_rows: str) -> Analysis:
    """Logs, the paper's data, or both (the paper's data then restricted to the logs' environments)."""
    from openrebench.analysis import Dataset, analyze, load_logs, load_paper, paper_headline
    from openrebench.harness import load_prices

    if not paths and not paper:
        raise OpenRebenchError("nothing to analyse: give Inspect log files or directories, and/or --paper")
    if human_rows not in ("real", "likely71"):
        raise OpenRebenchError(f"unknown --human-rows '{human_rows}' (known: real, likely71)")
    data = Dataset()
    if paths:
        data = load_logs(paths, skip_incomplete=skip_incomplete,
                         prices=load_prices(prices) if prices else None)
        if not data.attempts:
            raise OpenRebenchError("the logs hold no scored samples")
    environments = envs or (data.environments() if paths else None)
    if paper:
        paper_data = load_paper(human_rows)  # type: ignore[arg-type]
        if paths:
            paper_data.notes.append("the paper's runs are full-scale H100 runs; runs from the logs share "
                                    "only the normalisation with them (0 = start, 1 = reference)")
        data = data + paper_data
    analysis = analyze(data, environments=environments, budgets=_budgets(budgets), max_budget_h=max_budget,
                       boots=boots, sims=sims, seed=seed)
    if paper:
        # The published comparison is over all seven environments and every real human row.
        analysis.headline = paper_headline(boots=boots, sims=sims, seed=seed)
    return analysis


def _rich(spec) -> Table:  # type: ignore[no-untyped-def]
    table = Table(title=spec.title, caption=spec.caption or None, caption_justify="left", show_lines=True)
    for i, col in enumerate(spec.columns):
        table.add_column(col, justify="right" if i in spec.numeric else "left",
                         overflow="fold", max_width=70 if col == "note" else None)
    for row in spec.rows:
        table.add_row(*row)
    return table


def _print_headline(spec) -> None:  # type: ignore[no-untyped-def]
    """The headline with its long notes as numbered footnotes, so it reads in an 80-column terminal."""
    note = spec.columns.index("note")
    table = Table(title=spec.title, show_lines=True)
    for col in ("quantity", "ours (95% CI)", "paper", ""):
        table.add_column(col, overflow="fold")
    notes = []
    for row in spec.rows:
        if row[note]:
            notes.append(row[note])
        table.add_row(*row[:3], f"[{len(notes)}]" if row[note] else "")
    console.print(table)
    for i, text in enumerate(notes, 1):
        console.print(f"  [{i}] {text}", highlight=False, markup=False)
    console.print(f"  {spec.caption}", highlight=False, markup=False)


@user_errors
def analyze(
    paths: Paths = None, paper: PaperOpt = False, env: EnvOpt = None, budgets: BudgetsOpt = None,
    max_budget: MaxBudgetOpt = 32.0, boots: BootsOpt = 1000, sims: SimsOpt = 2000, seed: SeedOpt = 0,
    skip_incomplete: SkipOpt = False, prices: PricesOpt = None, human_rows: HumansOpt = "real",
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis as JSON.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Also print every run cell and split.")] = False,
) -> None:
    """score@k over total time budgets, per environment, against humans and cost, as tables."""
    from openrebench.analysis._tables import all_tables

    with err.status("Analysing…"):
        result = build_analysis(paths or [], paper, env, budgets, max_budget, boots, sims, seed,
                                skip_incomplete, prices, human_rows)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    console.print(f"[bold]Sources:[/] {', '.join(result.sources)}", highlight=False)
    console.print(f"[bold]Environments:[/] {', '.join(result.settings.environments)}", highlight=False)
    for spec in all_tables(result, full=full):
        if spec.key == "headline":
            _print_headline(spec)
        else:
            console.print(_rich(spec))
    for w in result.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)
    for n in result.notes:
        console.print(f"[dim]note: {n}[/]", highlight=False)


@user_errors
def report(
    paths: Paths = None, paper: PaperOpt = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    title: Annotated[str, typer.Option(help="Page title.")] = "openrebench analysis",
    env: EnvOpt = None, budgets: BudgetsOpt = None, max_budget: MaxBudgetOpt = 32.0,
    boots: BootsOpt = 1000, sims: SimsOpt = 2000, seed: SeedOpt = 0, skip_incomplete: SkipOpt = False,
    prices: PricesOpt = None,
    human_rows: HumansOpt = "real",
) -> None:
    """One self-contained HTML page with the figures and tables (open it in any browser)."""
    from openrebench.analysis._report import write_report

    with err.status("Analysing and drawing…"):
        result = build_analysis(paths or [], paper, env, budgets, max_budget, boots, sims, seed,
                                skip_incomplete, prices, human_rows)
        path = write_report(result, out, title)
    for w in result.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)
    size = path.stat().st_size / 1e6
    console.print(f"report written to [bold]{path}[/] ({size:.1f} MB)", highlight=False)
