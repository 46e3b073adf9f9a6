"""The analysis as a whole: checks the options, puts the data on its scales, runs the engine over every
group and assembles the one result (with its notes) that the tables, the JSON and the report read."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from openrebench.api import OpenRebenchError

from ._budget import default_budgets, fmt_hours, runs_for
from ._cohorts import PAPER_COHORT, PAPER_SIZE_TIERS, not_comparable, why_apart
from ._comparisons import _comparisons
from ._engine import _Engine
from ._estimators import SE_FLOOR
from ._model import Dataset, Normalisation, with_normalisation
from ._paper import PAPER_TIER
from ._results import COVERAGES, Allocation, Analysis, Coverage, GroupSummary, NormBudgetRow, Settings
from ._summaries import _cost, _env_model_rows, _env_rows, _normalisation_rows, _summary

HEADLINE_BUDGETS = (2.0, 8.0, 32.0)


def analyze(data: Dataset, *, environments: Sequence[str] | None = None,
            budgets: Sequence[float] | None = None, max_budget_h: float = 32.0, boots: int = 1000,
            sims: int = 2000, seed: int = 0, level: float = 0.95, coverage: Coverage = "all",
            normalisation: Normalisation | None = None) -> Analysis:
    """Everything the tables and the report show, for the attempts in `data`. `normalisation` None: the
    paper-matched scale for our runs where the paper's runs are in the data (the comparison is with the
    paper's humans), else the measured one."""
    return _run(data, environments, budgets, max_budget_h, boots, sims, seed, level, coverage,
                normalisation)[0]


def check_budgets(budgets: Sequence[float] | None, max_budget_h: float) -> None:
    """Budgets must be positive finite hours; one line otherwise."""
    if not (math.isfinite(max_budget_h) and max_budget_h > 0):
        raise OpenRebenchError(f"bad --max-budget {max_budget_h:g} (hours must be a positive number)")
    for b in budgets or []:
        if not (math.isfinite(b) and b > 0):
            raise OpenRebenchError(f"bad budget {b:g} h (budgets must be positive, finite hours)")


def _run(data: Dataset, environments: Sequence[str] | None, budgets: Sequence[float] | None,
         max_budget_h: float, boots: int, sims: int, seed: int, level: float, coverage: Coverage = "all",
         normalisation: Normalisation | None = None) -> tuple[Analysis, _Engine]:
    if not data.attempts:
        raise OpenRebenchError("no attempts to analyse")
    if coverage not in COVERAGES:
        raise OpenRebenchError(f"unknown --coverage '{coverage}' (known: {', '.join(COVERAGES)})")
    if normalisation not in (None, "measured", "paper"):
        raise OpenRebenchError(f"unknown --normalisation '{normalisation}' (known: auto, paper, measured)")
    check_budgets(budgets, max_budget_h)
    present = data.environments()
    envs = sorted(environments) if environments else present
    unknown = [e for e in envs if e not in present]
    if unknown:
        raise OpenRebenchError(f"no attempts at environment(s) {', '.join(unknown)} "
                               f"(present: {', '.join(present)})")
    if boots < 10 or sims < 10:
        raise OpenRebenchError("--boots and --sims need at least 10")
    with_paper = any(a.tier == PAPER_TIER for a in data.attempts)
    ours = [a for a in data.attempts if a.scores and a.env_id in envs]
    scale: Normalisation = normalisation or ("paper" if with_paper else "measured")
    scales = _scales(sorted({a.tier for a in ours}), normalisation, with_paper)
    data, scale_notes = with_normalisation(data, scale, scales)
    if ours and with_paper:
        scale_notes[:0] = [_scale_note(tier, s, normalisation) for tier, s in scales.items()]
    lengths = sorted({a.length_h for a in data.attempts if a.env_id in envs})
    budget_list = sorted(budgets) if budgets else default_budgets(lengths, max_budget_h)
    if not budget_list:
        runs = ", ".join(f"{x:g}" for x in lengths)
        raise OpenRebenchError(f"every run is longer than the largest budget ({max_budget_h:g} h; runs of "
                               f"{runs} h): raise --max-budget or give --budgets")
    if budgets and not any(runs_for(b, x) for b in budget_list for x in lengths):
        given = ", ".join(f"{b:g}" for b in budget_list)
        have = ", ".join(f"{x:g}" for x in lengths)
        raise OpenRebenchError(f"no budget in {given} h is a whole number of runs of any length in the data "
                               f"({have} h)")
    engine = _Engine(data, envs, budget_list, boots=boots, sims=sims, seed=seed, level=level,
                     coverage=coverage)
    warnings = list(data.warnings)
    groups, allocations, per_env, time_curves, cost, env_models, dropped = [], [], [], [], [], [], []
    for group, attempts in engine.by_group.items():
        summary = _summary(group, attempts, envs)
        groups.append(summary)
        per_env.extend(_env_rows(group, attempts))
        env_models.extend(_env_model_rows(group, attempts))
        allocs = engine.allocations(group, summary.is_human)
        dropped.extend(engine.dropped(group))
        if not allocs:
            missing = ", ".join(summary.missing) or "some lengths incomplete"
            warnings.append(f"{group}: no run length with runs in every environment of the analysis "
                            f"({missing} missing); no score@k (use --env to analyse fewer environments, or "
                            "--coverage covered)")
        allocations.extend(allocs)
        time_curves.extend(engine.time_curves(group))
        cost.extend(_cost(engine, group, [a for a in allocs if a.best]))
    kinds = ["human", "ours", "paper agent", "release model"]
    groups.sort(key=lambda g: (not g.is_human, kinds.index(g.kind), -g.mean_score, g.group))
    order = {g.group: i for i, g in enumerate(groups)}
    allocations.sort(key=lambda a: (order[a.group], a.budget_h, a.length_h))
    dropped.sort(key=lambda d: (order[d.group], d.length_h))
    notes = list(data.notes) + scale_notes + _apart_notes(groups) + [
        f"{d.group}: {d.runs} runs of {fmt_hours(d.length_h)} left out of score@k: they cover "
        f"{len(d.environments)} of {len(envs)} environments (none in {', '.join(d.missing)}); "
        "--coverage covered averages over the environments covered" for d in dropped]
    notes += _floor_notes(allocations)
    comparisons = _comparisons(engine, groups, allocations)
    partial_humans = []
    for env_set in sorted({tuple(a.environments) for a in allocations if a.partial}):
        for g in (g for g in groups if g.is_human):
            for budget in budget_list:
                if (found := engine.on_envs(g.group, True, budget, env_set)) is not None:
                    partial_humans.append(found[0])
    analysis = Analysis(
        settings=Settings(environments=envs, hidden_score=sorted(engine.hidden), budgets_h=budget_list,
                          boots=boots, sims=sims, level=level, seed=seed, coverage=coverage,
                          normalisation=scale, scales=scales),
        sources=data.sources, warnings=warnings, notes=notes, groups=groups,
        allocations=allocations,
        per_env=sorted(per_env, key=lambda r: (order[r.group], r.env_id, r.length_h)),
        comparisons=comparisons,
        time_curves=time_curves, cost=cost,
        env_models=sorted(env_models, key=lambda r: (order[r.group], r.role is not None, r.role or "")),
        dropped=dropped, partial_humans=partial_humans, paper=data.paper,
        normalisation=sorted(_normalisation_rows(ours), key=lambda r: (order.get(r.group, 0), r.env_id)))
    if ours:
        analysis.normalisation_budgets = _both_scales(data, analysis, envs, budget_list, boots, sims, seed,
                                                      level, coverage)
    return analysis, engine


def _scales(tiers: Sequence[str], asked: Normalisation | None, with_paper: bool) -> dict[str, Normalisation]:
    """Our runs' scale by tier: as asked; else beside the paper's data, paper-matched at the paper's size
    and measured at the others (they are not compared with the paper's humans, and the paper-matched score
    of a smaller task means nothing to them); else measured."""
    if asked is not None:
        return {t: asked for t in tiers}
    return {t: "paper" if with_paper and t in PAPER_SIZE_TIERS else "measured" for t in tiers}


def _scale_note(tier: str, scale: Normalisation, asked: Normalisation | None) -> str:
    """How our runs of one tier are scaled beside the paper's data, and whether they meet its humans."""
    ours = f"our runs at tier {tier} are on the"
    if tier in PAPER_SIZE_TIERS:
        if scale == "paper":
            return (f"{ours} paper-matched scale (the paper's start-to-reference gap from the start measured "
                    "on our hardware), as they are compared with the paper's humans")
        return (f"{ours} measured scale, not the paper's: their scores and the paper's humans' are not on "
                "one scale, so they are not compared")
    if scale == "paper" and asked == "paper":
        return (f"{ours} paper-matched scale, as asked, but are not compared with the paper's humans (tier "
                f"{tier}: not the paper's task size)")
    return (f"{ours} measured scale (their own tier's start and reference): they are not compared with the "
            "paper's humans, who worked at the paper's full size")


def _apart_notes(groups: Sequence[GroupSummary]) -> list[str]:
    """One line per cohort kept apart, where the paper's humans are in the analysis."""
    if not any(g.is_human and g.cohort == PAPER_COHORT for g in groups):
        return []
    cohorts: dict[str, list[GroupSummary]] = defaultdict(list)
    for g in groups:
        if g.not_comparable:
            cohorts[g.not_comparable].append(g)
    return [f"{', '.join(g.group for g in members)}: {not_comparable(why)}: {why_apart(why)}. No ratio, "
            "percentage or head-to-head with the paper's humans or agents is given for them; they have "
            "tables and figure panels of their own" for why, members in cohorts.items()]


def _floor_notes(allocations: Sequence[Allocation]) -> list[str]:
    """Where the sampling standard error was floored, in one line."""
    floored = [a for a in allocations if a.estimate.se_floored]
    if not floored:
        return []
    groups = list(dict.fromkeys(a.group for a in floored))
    named = ", ".join(groups[:4]) + (f" and {len(groups) - 4} more" if len(groups) > 4 else "")
    return [f"sampling standard error below its floor of {SE_FLOOR:g} (normalised units) in {len(floored)} "
            f"of {len(allocations)} splits ({named}): their sampled-against-exact z uses the floor. Runs "
            "with (near-)identical scores give an SE of round-off alone, over which a round-off difference "
            "would read as hundreds of thousands of SEs; a difference below the floor is below what the "
            "tables show"]


def _both_scales(data: Dataset, analysis: Analysis, envs: Sequence[str], budgets: list[float], boots: int,
                 sims: int, seed: int, level: float, coverage: Coverage) -> list[NormBudgetRow]:
    """Our groups' score@k at the headline budgets (those present) on both scales."""
    ours = [g.group for g in analysis.groups if g.kind == "ours" and not g.is_human]
    mine = data.model_copy(update={"attempts": [a for a in data.attempts if a.group in ours]})
    shown = [b for b in budgets if b in HEADLINE_BUDGETS] or budgets[:3]
    curves = {}
    for scale in ("measured", "paper"):
        scaled, _ = with_normalisation(mine, scale)  # type: ignore[arg-type]
        engine = _Engine(scaled, envs, shown, boots=max(10, boots // 4), sims=max(10, sims // 4), seed=seed,
                         level=level, coverage=coverage)
        curves[scale] = {(a.group, a.budget_h): a for g in ours for a in engine.allocations(g, False)
                         if a.best}
    rows = []
    for g in ours:
        for b in shown:
            m, p = curves["measured"].get((g, b)), curves["paper"].get((g, b))
            if m is None and p is None:
                continue
            rows.append(NormBudgetRow(group=g, budget_h=b, allocation=(m or p).label,  # type: ignore[union-attr]
                                      measured=m.estimate.exact if m else None,
                                      paper=p.estimate.exact if p else None))
    return rows
