"""Agents against humans: each agent's best split at a budget beside a human group's score over the
same environments, within one cohort, with the ratio and its interval."""

from __future__ import annotations

from collections.abc import Sequence

from ._budget import fmt_hours
from ._engine import _Engine, _ratio_interval
from ._estimators import SE_FLOOR, Array
from ._results import Allocation, Comparison, GroupSummary


def human_for(engine: _Engine, human: str, budget: float, envs: Sequence[str],
              best: dict[tuple[str, float], Allocation]) -> tuple[Allocation | None, Array | None]:
    """A human group's score@k at `budget` over the environments `envs` (its best split), with its
    bootstrap replicates."""
    if sorted(envs) == sorted(engine.envs):
        h = best.get((human, budget))
        return h, engine.replicates.get((human, budget))
    found = engine.on_envs(human, True, budget, envs)
    return (found[0], found[1]) if found else (None, None)


def _comparisons(engine: _Engine, groups: list[GroupSummary],
                 allocations: list[Allocation]) -> list[Comparison]:
    best = {(a.group, a.budget_h): a for a in allocations if a.best}
    out = []
    for h_group in (g for g in groups if g.is_human):
        human = h_group.group
        # Only within a cohort: a mini run is never set against the paper's humans (see _cohorts).
        for agent in (g.group for g in groups if not g.is_human and g.cohort == h_group.cohort):
            for budget in engine.budgets:
                alloc = best.get((agent, budget))
                if alloc is None:
                    continue
                h, h_reps = human_for(engine, human, budget, alloc.environments, best)
                human_score = h.estimate.exact if h else None
                # A ratio over a human score below the floor would be round-off over round-off.
                ratio = (alloc.estimate.exact / human_score if human_score and human_score >= SE_FLOOR
                         else None)
                note = "" if h else f"no {human} score at {fmt_hours(budget)} (needs attempts' score logs)"
                if h and ratio is None:
                    note = f"{human} score {human_score:.3g} is below {SE_FLOOR:g}: no ratio"
                reps = engine.replicates.get((agent, budget))
                ci = _ratio_interval(reps, h_reps, engine.level) if (
                    ratio is not None and reps is not None and h_reps is not None) else None
                out.append(Comparison(
                    agent=agent, human=human, budget_h=budget, agent_score=alloc.estimate.exact,
                    agent_allocation=alloc.label, human_score=human_score, ratio=ratio, ratio_ci=ci,
                    percentile=engine.percentile(agent, alloc, human), environments=alloc.environments,
                    note=note))
    return out
