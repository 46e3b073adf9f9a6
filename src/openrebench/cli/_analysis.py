"""`openrebench analyze` and `openrebench report`: score@k over time budgets, agents against humans."""

from __future__ import annotations

import math
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
    "Paper human rows: 'real' (the 86 actual attempts) or 'likely71' (those likely among the paper's 71, "
    "and in environments where none is marked likely, the unknown ones)."))]
HoursOpt = Annotated[str, typer.Option("--human-hours", help=(
    "Paper human attempts by length, 'MIN-MAX' hours or 'all'. Default 7-9: the paper's 8-hour attempts "
    "(the release's longer ones hold a final score that overstates an 8-hour one)."))]
HacksOpt = Annotated[str, typer.Option("--hacks", help=(
    "Paper runs that look like reward hacks: 'paper' (the paper's treatment: runs METR judged as cheating "
    "score 0), 'keep' (as released), 'zero' or 'cap' (every suspect run zeroed, or capped at 1)."))]
CoverageOpt = Annotated[str, typer.Option("--coverage", help=(
    "'all': a run length counts for score@k only with runs in every environment; 'covered': also with "
    "runs in some, averaged over those (marked, and compared with humans on those)."))]
NormOpt = Annotated[str, typer.Option("--normalisation", help=(
    "Our runs' scale: 'auto' (paper-matched beside the paper's data, else measured), 'paper' or "
    "'measured'."))]
PaperDataOpt = Annotated[Path | None, typer.Option("--paper-data", help=(
    "A folder with the release's human_baselines.csv and agent_runs.csv to read instead of the packaged "
    "copy."), show_default=False)]


def _budgets(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OpenRebenchError(f"bad --budgets '{text}' (use hours, e.g. 2,8,32)") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise OpenRebenchError(f"bad --budgets '{text}' (hours must be positive, finite numbers)")
    return values


def _one_of(value: str, option: str, known: tuple[str, ...]) -> str:
    if value not in known:
        raise OpenRebenchError(f"unknown {option} '{value}' (known: {', '.join(known)})")
    return value


class Choices:
    """How the paper's data is read and our runs are scaled (the options shared by analyze and report)."""

    def __init__(self, human_rows: str = "real", human_hours: str = "7-9", hacks: str = "paper",
                 coverage: str = "all", normalisation: str = "auto", paper_data: Path | None = None) -> None:
        from openrebench.analysis import COVERAGES, HACKS, HUMAN_ROWS, parse_hours

        self.options = {"human_rows": _one_of(human_rows, "--human-rows", HUMAN_ROWS),
                        "hacks": _one_of(hacks, "--hacks", HACKS), "human_hours": parse_hours(human_hours),
                        "data_dir": paper_data}
        self.coverage = _one_of(coverage, "--coverage", COVERAGES)
        normalisation = _one_of(normalisation, "--normalisation", ("auto", "paper", "measured"))
        self.normalisation = None if normalisation == "auto" else normalisation
        if paper_data is not None and not Path(paper_data).is_dir():
            raise OpenRebenchError(f"--paper-data {paper_data} is not a folder")


def build_analysis(paths: list[Path], paper: bool, envs: list[str] | None, budgets: str | None,
                   max_budget: float, boots: int, sims: int, seed: int, skip_incomplete: bool,
                   prices: Path | None, choices: Choices | None = None) -> Analysis:
    """Logs, the paper's data, or both (the paper's data then restricted to the logs' environments)."""
    from openrebench.analysis import Dataset, analyze, load_logs, load_paper, paper_headline
    from openrebench.harness import load_prices

    choices = choices or Choices()
    if not paths and not paper:
        raise OpenRebenchError("nothing to analyse: give Inspect log files or directories, and/or --paper")
    budget_list = _budgets(budgets)
    data = Dataset()
    if paths:
        data = load_logs(paths, skip_incomplete=skip_incomplete,
                         prices=load_prices(prices) if prices else None)
        if not data.attempts:
            raise OpenRebenchError("the logs hold no scored samples")
    environments = envs or (data.environments() if paths else None)
    if paper:
        paper_data = load_paper(**choices.options)
        if paths:
            paper_data.notes.append("the paper's runs are full-scale H100 runs: only runs from the logs at "
                                    "the full tier, on the paper-matched scale, are compared with them; runs "
                                    "of other tiers are shown apart")
        data = data + paper_data
    analysis = analyze(data, environments=environments, budgets=budget_list, max_budget_h=max_budget,
                       boots=boots, sims=sims, seed=seed, coverage=choices.coverage,  # type: ignore[arg-type]
                       normalisation=choices.normalisation)  # type: ignore[arg-type]
    if paper:
        # The published comparison is over all seven environments, read with the same choices.
        head = paper_headline(choices.options, choices.coverage, boots=boots,  # type: ignore[arg-type]
                              sims=sims, seed=seed)
        analysis.headline, analysis.claims = head.headline, head.claims
        analysis.alternatives = head.alternatives
    return analysis


def _rich(spec) -> Table:  # type: ignore[no-untyped-def]
    table = Table(title=spec.title, caption=spec.caption or None, caption_justify="left", show_lines=True)
    for i, col in enumerate(spec.columns):
        table.add_column(col, justify="right" if i in spec.numeric else "left",
                         overflow="fold", max_width=70 if col == "note" else None)
    for row in spec.rows:
        table.add_row(*row)
    return table


def _print_footnoted(spec, column: str) -> None:  # type: ignore[no-untyped-def]
    """A table with its long text column as numbered footnotes, so it reads in an 80-column terminal."""
    note = spec.columns.index(column)
    table = Table(title=spec.title, show_lines=True)
    for col in [c for i, c in enumerate(spec.columns) if i != note] + [""]:
        table.add_column(col, overflow="fold")
    notes = []
    for row in spec.rows:
        if row[note]:
            notes.append(row[note])
        table.add_row(*(v for i, v in enumerate(row) if i != note), f"[{len(notes)}]" if row[note] else "")
    console.print(table)
    for i, text in enumerate(notes, 1):
        console.print(f"  [{i}] {text}", highlight=False, markup=False)
    console.print(f"  {spec.caption}", highlight=False, markup=False)


@user_errors
def analyze(
    paths: Paths = None, paper: PaperOpt = False, env: EnvOpt = None, budgets: BudgetsOpt = None,
    max_budget: MaxBudgetOpt = 32.0, boots: BootsOpt = 1000, sims: SimsOpt = 2000, seed: SeedOpt = 0,
    skip_incomplete: SkipOpt = False, prices: PricesOpt = None, human_rows: HumansOpt = "real",
    human_hours: HoursOpt = "7-9", hacks: HacksOpt = "paper", coverage: CoverageOpt = "all",
    normalisation: NormOpt = "auto", paper_data: PaperDataOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis as JSON.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Also print every run cell and split.")] = False,
) -> None:
    """score@k over total time budgets, per environment, against humans and cost, as tables."""
    from openrebench.analysis import all_tables

    choices = Choices(human_rows, human_hours, hacks, coverage, normalisation, paper_data)
    with err.status("Analysing…"):
        result = build_analysis(paths or [], paper, env, budgets, max_budget, boots, sims, seed,
                                skip_incomplete, prices, choices)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    console.print(f"[bold]Sources:[/] {', '.join(result.sources)}", highlight=False)
    console.print(f"[bold]Environments:[/] {', '.join(result.settings.environments)}", highlight=False)
    for spec in all_tables(result, full=full):
        if spec.key in ("headline", "claims"):
            _print_footnoted(spec, "note" if spec.key == "headline" else "why")
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
    prices: PricesOpt = None, human_rows: HumansOpt = "real", human_hours: HoursOpt = "7-9",
    hacks: HacksOpt = "paper", coverage: CoverageOpt = "all", normalisation: NormOpt = "auto",
    paper_data: PaperDataOpt = None,
) -> None:
    """One self-contained HTML page with the figures and tables (open it in any browser)."""
    from openrebench.analysis import write_report

    choices = Choices(human_rows, human_hours, hacks, coverage, normalisation, paper_data)
    with err.status("Analysing and drawing…"):
        result = build_analysis(paths or [], paper, env, budgets, max_budget, boots, sims, seed,
                                skip_incomplete, prices, choices)
        path = write_report(result, out, title)
    for w in result.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)
    size = path.stat().st_size / 1e6
    console.print(f"report written to [bold]{path}[/] ({size:.1f} MB)", highlight=False)
