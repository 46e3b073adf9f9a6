"""The analysis: score@k against total time budget per group, per environment, against humans, over
time and against cost. One pydantic result feeds the terminal tables, the JSON and the HTML report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, computed_field

from openrebench.api import OpenRebenchError

from ._budget import default_budgets, fmt_hours, runs_for
from ._environments import facts_for
from ._estimators import Array, Estimate, percentile_interval, prob_best_of_k_beats, score_at_k
from ._model import Attempt, Dataset, EnvFacts, ModelUse
from ._over_time import interpolated, score_at, time_grid

HEADLINE_BUDGETS = (2.0, 8.0, 32.0)


class Settings(BaseModel):
    environments: list[str]
    hidden_score: list[str] = Field(default_factory=list, description="Environments of the analysis whose "
                                    "score the agent cannot see (best of k takes a random run).")
    budgets_h: list[float]
    boots: int = Field(description="Bootstrap resamples for the confidence intervals.")
    sims: int = Field(description="Draws of k runs for the paper's sampling estimate.")
    level: float
    seed: int


class GroupSummary(BaseModel):
    group: str
    is_human: bool
    tiers: list[str]
    runs: int
    runs_by_env: dict[str, int]
    lengths_h: list[float]
    mean_score: float
    frac_nonzero: float
    frac_ge_reference: float
    tokens_per_run: float | None = Field(description="The agent's model tokens.")
    cost_per_run_usd: float | None = Field(description="The agent's model cost.")
    env_tokens_per_run: float | None = Field(
        default=None, description="The environment's own model calls (the gateway's totals), tokens; None: "
                                  "no run of the group used any.")
    env_cost_per_run_usd: float | None = Field(default=None, description="The same in US$.")
    gpu_hours_per_run: float | None
    hours_used_per_run: float | None
    with_trajectories: int = Field(description="Runs that carry a score log (score over time).")
    missing: list[str] = Field(default_factory=list, description="Analysed environments it has no runs in.")


class Allocation(BaseModel):
    """One way of spending a budget: k runs of length L (or, for humans below their attempt length,
    the score their attempts had reached at T)."""

    group: str
    budget_h: float
    length_h: float
    k: int
    method: Literal["best_of_k", "reached_at_budget"]
    estimate: Estimate
    min_runs: int = Field(description="Fewest runs in any environment (k above this leans on one run).")
    best: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        if self.method == "reached_at_budget":
            return f"first {fmt_hours(self.budget_h)} of {fmt_hours(self.length_h)} attempts"
        return f"{self.k} × {fmt_hours(self.length_h)}"


class EnvRow(BaseModel):
    group: str
    env_id: str
    length_h: float
    runs: int
    mean: float
    median: float
    max: float
    frac_nonzero: float
    frac_ge_reference: float


class Comparison(BaseModel):
    """An agent against a human group at one total budget."""

    agent: str
    human: str
    budget_h: float
    agent_score: float
    agent_allocation: str
    human_score: float | None
    ratio: float | None = Field(description="agent / human score@budget.")
    ratio_ci: tuple[float, float] | None
    percentile: float | None = Field(
        description="Chance (in %) that the agent's best-of-k at this budget beats a random human attempt, "
                    "averaged over environments.")
    note: str = ""


class TimeCurve(BaseModel):
    group: str
    length_h: float
    runs: int
    environments: list[str]
    hours: list[float]
    mean: list[float]
    ci_low: list[float]
    ci_high: list[float]


class CostPoint(BaseModel):
    group: str
    budget_h: float
    allocation: str
    score: float
    ci_low: float
    ci_high: float
    tokens: float | None = Field(description="The agent's model tokens.")
    dollars: float | None = Field(description="The agent's model cost.")
    env_tokens: float | None = Field(default=None, description="The environment's own model calls' tokens.")
    env_dollars: float | None = Field(default=None, description="... and their cost.")
    gpu_hours: float | None


class EnvModelRow(BaseModel):
    """A group's calls to its environments' own models through the gateway, one role (or all: `role`
    None), summed over the group's runs."""

    group: str
    role: str | None
    runs: int = Field(description="Runs that called a model in this role.")
    usage: ModelUse


class HeadlineRow(BaseModel):
    """A published number beside ours."""

    key: str
    label: str
    reproduced: str
    value: float | None
    ci: tuple[float, float] | None = None
    published: str
    published_value: float | None
    citation: str
    note: str = ""


class Analysis(BaseModel):
    settings: Settings
    sources: list[str]
    warnings: list[str]
    notes: list[str]
    groups: list[GroupSummary]
    allocations: list[Allocation]
    per_env: list[EnvRow]
    comparisons: list[Comparison]
    time_curves: list[TimeCurve]
    cost: list[CostPoint]
    env_models: list[EnvModelRow] = Field(default_factory=list)
    headline: list[HeadlineRow] | None = None

    def curve(self, group: str) -> list[Allocation]:
        return [a for a in self.allocations if a.group == group and a.best]

    def best_at(self, group: str, budget_h: float) -> Allocation | None:
        return next((a for a in self.curve(group) if abs(a.budget_h - budget_h) < 1e-9), None)


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present and len(present) == len(values) else None


def _env_mean(attempts: Sequence[Attempt], what: str) -> float | None:
    """The mean of the environment models' `tokens` or `cost_usd` per run, a run without gateway use
    counting as none; None where no run used it, or a cost is unknown."""
    if all(a.env_models is None for a in attempts):
        return None
    return _mean([getattr(a.env_models or ModelUse(), what) for a in attempts])


def _env_model_rows(group: str, attempts: list[Attempt]) -> list[EnvModelRow]:
    used = [a for a in attempts if a.env_models is not None]
    if not used:
        return []
    roles = sorted({r for a in used for r in a.env_roles})
    rows = [EnvModelRow(group=group, role=None, runs=len(used),
                        usage=sum((a.env_models or ModelUse() for a in used), ModelUse()))]
    for role in roles:
        with_role = [a.env_roles[role] for a in used if role in a.env_roles]
        rows.append(EnvModelRow(group=group, role=role, runs=len(with_role),
                                usage=sum(with_role, ModelUse())))
    return rows


class _Engine:
    """Holds the attempts by group, environment and length, and the bootstrap replicates of each
    group's best allocation (for ratio intervals)."""

    def __init__(self, data: Dataset, environments: Sequence[str], budgets: Sequence[float], *, boots: int,
                 sims: int, seed: int, level: float) -> None:
        self.envs = list(environments)
        self.facts: dict[str, EnvFacts] = facts_for(self.envs, data.env_facts)
        self.hidden = frozenset(e for e, f in self.facts.items() if not f.score_visible)
        self.budgets = list(budgets)
        self.boots, self.sims, self.seed, self.level = boots, sims, seed, level
        self.by_group: dict[str, list[Attempt]] = defaultdict(list)
        for a in data.attempts:
            if a.env_id in self.envs:
                self.by_group[a.group].append(a)
        self.replicates: dict[tuple[str, float], Array] = {}

    def last(self, env: str) -> bool:
        """Whether a run's score at a time is its last valid scoring so far (else its best so far)."""
        return self.facts[env].last_counts

    def cell(self, group: str, env: str, length: float) -> list[Attempt]:
        return [a for a in self.by_group[group] if a.env_id == env and a.length_h == length]

    def lengths(self, group: str) -> list[float]:
        return sorted({a.length_h for a in self.by_group[group]})

    def covered(self, group: str, length: float) -> bool:
        return all(self.cell(group, env, length) for env in self.envs)

    def _seed(self, *parts: object) -> int:
        return (self.seed * 1_000_003 + sum(ord(c) for c in repr(parts)) * 7919) % (2**32)

    def allocations(self, group: str, is_human: bool) -> list[Allocation]:
        out: list[Allocation] = []
        for budget in self.budgets:
            candidates: list[tuple[Allocation, Array]] = []
            for length in self.lengths(group):
                if not self.covered(group, length):
                    continue
                cells = {env: self.cell(group, env, length) for env in self.envs}
                k = runs_for(budget, length)
                if k is not None:
                    per_env = {env: np.array([a.score for a in c]) for env, c in cells.items()}
                    method: Literal["best_of_k", "reached_at_budget"] = "best_of_k"
                elif is_human and budget < length and all(a.trajectory for c in cells.values() for a in c):
                    k = 1
                    per_env = {env: np.array([score_at(a.trajectory or [], budget, self.last(env))
                                              for a in c]) for env, c in cells.items()}
                    method = "reached_at_budget"
                else:
                    continue
                est, reps = score_at_k(per_env, k, self.hidden, sims=self.sims, boots=self.boots,
                                       seed=self._seed(group, budget, length), level=self.level)
                alloc = Allocation(group=group, budget_h=budget, length_h=length, k=k, method=method,
                                   estimate=est, min_runs=min(len(c) for c in cells.values()))
                candidates.append((alloc, reps))
            if not candidates:
                continue
            best, reps = max(candidates, key=lambda c: c[0].estimate.exact)
            best.best = True
            self.replicates[(group, budget)] = reps
            out.extend(a for a, _ in candidates)
        return out

    def percentile(self, agent: str, alloc: Allocation, human: str) -> float | None:
        if alloc.method != "best_of_k":
            return None
        values = []
        for env in self.envs:
            humans = np.array([a.score for a in self.by_group[human] if a.env_id == env])
            if humans.size == 0:
                return None
            runs = np.array([a.score for a in self.cell(agent, env, alloc.length_h)])
            values.append(prob_best_of_k_beats(runs, 1 if env in self.hidden else alloc.k, humans))
        return 100 * float(np.mean(values))

    def ratio_ci(self, num: tuple[str, float], den: tuple[str, float]) -> tuple[float, float] | None:
        a, b = self.replicates.get(num), self.replicates.get(den)
        if a is None or b is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return percentile_interval(a / b, self.level)

    def time_curves(self, group: str) -> list[TimeCurve]:
        out = []
        for length in self.lengths(group):
            cells = {env: [a for a in self.cell(group, env, length) if a.trajectory is not None]
                     for env in self.envs}
            cells = {env: c for env, c in cells.items() if c}
            if not cells:
                continue
            grid = time_grid(length)
            rng = np.random.default_rng(self._seed("time", group, length))
            mean = np.zeros(len(grid))
            reps = np.zeros((self.boots, len(grid)))
            for env, runs in cells.items():
                m = np.array([interpolated(a.trajectory or [], grid, self.last(env)) for a in runs])
                mean += m.mean(axis=0)
                reps += m[rng.integers(0, len(m), size=(self.boots, len(m)))].mean(axis=1)
            mean /= len(cells)
            reps /= len(cells)
            tail = (1 - self.level) / 2 * 100
            lo, hi = np.percentile(reps, [tail, 100 - tail], axis=0)
            out.append(TimeCurve(group=group, length_h=length, runs=sum(len(c) for c in cells.values()),
                                 environments=sorted(cells), hours=grid.tolist(), mean=mean.tolist(),
                                 ci_low=lo.tolist(), ci_high=hi.tolist()))
        return out


def _summary(group: str, attempts: list[Attempt], envs: Sequence[str]) -> GroupSummary:
    scores = np.array([a.score for a in attempts])
    by_env: dict[str, int] = defaultdict(int)
    for a in attempts:
        by_env[a.env_id] += 1
    return GroupSummary(
        group=group, is_human=attempts[0].is_human, tiers=sorted({a.tier for a in attempts}),
        runs=len(attempts),
        runs_by_env=dict(sorted(by_env.items())), lengths_h=sorted({a.length_h for a in attempts}),
        mean_score=float(scores.mean()), frac_nonzero=float((scores > 0).mean()),
        frac_ge_reference=float((scores >= 1).mean()),
        tokens_per_run=_mean([a.tokens for a in attempts]),
        cost_per_run_usd=_mean([a.cost_usd for a in attempts]),
        env_tokens_per_run=_env_mean(attempts, "tokens"),
        env_cost_per_run_usd=_env_mean(attempts, "cost_usd"),
        gpu_hours_per_run=_mean([a.gpu_hours for a in attempts]),
        hours_used_per_run=_mean([a.hours_used for a in attempts]),
        with_trajectories=sum(a.trajectory is not None for a in attempts),
        missing=[e for e in envs if e not in by_env])


def _env_rows(group: str, attempts: list[Attempt]) -> list[EnvRow]:
    cells: dict[tuple[str, float], list[float]] = defaultdict(list)
    for a in attempts:
        cells[(a.env_id, a.length_h)].append(a.score)
    rows = []
    for (env, length), values in sorted(cells.items()):
        v = np.array(values)
        rows.append(EnvRow(group=group, env_id=env, length_h=length, runs=len(v), mean=float(v.mean()),
                           median=float(np.median(v)), max=float(v.max()), frac_nonzero=float((v > 0).mean()),
                           frac_ge_reference=float((v >= 1).mean())))
    return rows


def _cost(engine: _Engine, group: str, curve: list[Allocation]) -> list[CostPoint]:
    points = []
    for alloc in curve:
        if alloc.method != "best_of_k":
            continue
        runs = [a for env in engine.envs for a in engine.cell(group, env, alloc.length_h)]
        per_run = {"tokens": _mean([a.tokens for a in runs]), "dollars": _mean([a.cost_usd for a in runs]),
                   "env_tokens": _env_mean(runs, "tokens"), "env_dollars": _env_mean(runs, "cost_usd"),
                   "gpu_hours": _mean([a.gpu_hours for a in runs])}
        if all(v is None for v in per_run.values()):
            continue
        est = alloc.estimate
        points.append(CostPoint(group=group, budget_h=alloc.budget_h, allocation=alloc.label, score=est.exact,
                                ci_low=est.ci_low, ci_high=est.ci_high,
                                **{key: None if v is None else v * alloc.k for key, v in per_run.items()}))
    return points


def analyze(data: Dataset, *, environments: Sequence[str] | None = None,
            budgets: Sequence[float] | None = None, max_budget_h: float = 32.0, boots: int = 1000,
            sims: int = 2000, seed: int = 0, level: float = 0.95) -> Analysis:
    """Everything the tables and the report show, for the attempts in `data`."""
    return _run(data, environments, budgets, max_budget_h, boots, sims, seed, level)[0]


def _run(data: Dataset, environments: Sequence[str] | None, budgets: Sequence[float] | None,
         max_budget_h: float, boots: int, sims: int, seed: int, level: float) -> tuple[Analysis, _Engine]:
    if not data.attempts:
        raise OpenRebenchError("no attempts to analyse")
    present = data.environments()
    envs = sorted(environments) if environments else present
    unknown = [e for e in envs if e not in present]
    if unknown:
        raise OpenRebenchError(f"no attempts at environment(s) {', '.join(unknown)} "
                               f"(present: {', '.join(present)})")
    if boots < 10 or sims < 10:
        raise OpenRebenchError("--boots and --sims need at least 10")
    lengths = sorted({a.length_h for a in data.attempts if a.env_id in envs})
    budget_list = sorted(budgets) if budgets else default_budgets(lengths, max_budget_h)
    if not budget_list:
        runs = ", ".join(f"{x:g}" for x in lengths)
        raise OpenRebenchError(f"every run is longer than the largest budget ({max_budget_h:g} h; runs of "
                               f"{runs} h): raise --max-budget or give --budgets")
    engine = _Engine(data, envs, budget_list, boots=boots, sims=sims, seed=seed, level=level)
    warnings = list(data.warnings)
    groups, allocations, per_env, time_curves, cost, env_models = [], [], [], [], [], []
    for group, attempts in engine.by_group.items():
        summary = _summary(group, attempts, envs)
        groups.append(summary)
        per_env.extend(_env_rows(group, attempts))
        env_models.extend(_env_model_rows(group, attempts))
        allocs = engine.allocations(group, summary.is_human)
        if not allocs:
            missing = ", ".join(summary.missing) or "some lengths incomplete"
            warnings.append(f"{group}: no run length with runs in every environment of the analysis "
                            f"({missing} missing); no score@k (use --env to analyse fewer environments)")
        allocations.extend(allocs)
        time_curves.extend(engine.time_curves(group))
        cost.extend(_cost(engine, group, [a for a in allocs if a.best]))
    groups.sort(key=lambda g: (not g.is_human, -g.mean_score, g.group))
    order = {g.group: i for i, g in enumerate(groups)}
    allocations.sort(key=lambda a: (order[a.group], a.budget_h, a.length_h))
    comparisons = _comparisons(engine, groups, allocations)
    return Analysis(
        settings=Settings(environments=envs, hidden_score=sorted(engine.hidden), budgets_h=budget_list,
                          boots=boots, sims=sims, level=level,
                          seed=seed),
        sources=data.sources, warnings=warnings, notes=list(data.notes), groups=groups,
        allocations=allocations,
        per_env=sorted(per_env, key=lambda r: (order[r.group], r.env_id, r.length_h)),
        comparisons=comparisons,
        time_curves=time_curves, cost=cost,
        env_models=sorted(env_models, key=lambda r: (order[r.group], r.role is not None, r.role or ""))
    ), engine


def _comparisons(engine: _Engine, groups: list[GroupSummary],
                 allocations: list[Allocation]) -> list[Comparison]:
    best = {(a.group, a.budget_h): a for a in allocations if a.best}
    out = []
    for human in (g.group for g in groups if g.is_human):
        for agent in (g.group for g in groups if not g.is_human):
            for budget in engine.budgets:
                alloc = best.get((agent, budget))
                if alloc is None:
                    continue
                h = best.get((human, budget))
                human_score = h.estimate.exact if h else None
                ratio = alloc.estimate.exact / human_score if human_score else None
                note = "" if h else f"no {human} score at {fmt_hours(budget)} (needs attempts' score logs)"
                out.append(Comparison(
                    agent=agent, human=human, budget_h=budget, agent_score=alloc.estimate.exact,
                    agent_allocation=alloc.label, human_score=human_score, ratio=ratio,
                    ratio_ci=engine.ratio_ci((agent, budget), (human, budget)) if ratio is not None else None,
                    percentile=engine.percentile(agent, alloc, human), note=note))
    return out
