"""The analysis: score@k against total time budget per group, per environment, against humans, over
time and against cost. One pydantic result feeds the terminal tables, the JSON and the HTML report."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, computed_field

from openrebench.api import OpenRebenchError

from ._budget import default_budgets, fmt_hours, runs_for
from ._cohorts import PAPER_COHORT, PAPER_SIZE_TIERS, cohort_of, not_comparable, why_apart
from ._environments import facts_for
from ._estimators import SE_FLOOR, Array, Estimate, percentile_interval, prob_best_of_k_beats, score_at_k
from ._model import Attempt, Dataset, EnvFacts, ModelUse, Normalisation, PaperTreatment, with_normalisation
from ._over_time import interpolated, score_at, time_grid
from ._paper import PAPER_AGENTS, PAPER_TIER

HEADLINE_BUDGETS = (2.0, 8.0, 32.0)
Coverage = Literal["all", "covered"]
COVERAGES: tuple[str, ...] = ("all", "covered")
GroupKind = Literal["human", "paper agent", "release model", "ours"]


class Settings(BaseModel):
    environments: list[str]
    hidden_score: list[str] = Field(default_factory=list, description="Environments of the analysis whose "
                                    "score the agent cannot see (best of k takes a random run).")
    budgets_h: list[float]
    boots: int = Field(description="Bootstrap resamples for the confidence intervals.")
    sims: int = Field(description="Draws of k runs for the paper's sampling estimate.")
    level: float
    seed: int
    coverage: Coverage = Field(default="all", description=(
        "'all': a run length counts for score@k only with runs in every environment of the analysis; "
        "'covered': also with runs in some, averaged over those (marked)."))
    normalisation: Normalisation = Field(default="measured", description=(
        "The scale of our runs' scores: 'measured' (this machine's start and reference) or 'paper' "
        "(paper-matched). The paper's runs are on the paper's scale."))
    scales: dict[str, Normalisation] = Field(default_factory=dict, description=(
        "Our runs' scale by tier: beside the paper's data, by default, paper-matched at the full tier (the "
        "paper's size) and measured at the others, which are not compared with the paper's humans."))


class GroupSummary(BaseModel):
    group: str
    is_human: bool
    kind: GroupKind = "ours"
    label: str = Field(default="", description="The group as figures name it (with its kind and scaffold).")
    scaffold: str | None = Field(default=None, description="The agent scaffold where recorded.")
    tiers: list[str]
    runs: int
    runs_by_env: dict[str, int]
    lengths_h: list[float]
    mean_score: float
    frac_nonzero: float
    frac_ge_reference: float
    mean_measured: float | None = Field(default=None, description="Our runs: mean on the measured scale.")
    mean_paper: float | None = Field(default=None, description="Our runs: mean on the paper-matched scale.")
    altered: int = Field(default=0, description="Runs whose released score the analysis changed.")
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
    cohort: str = Field(default=PAPER_COHORT, description=(
        "Groups compared with each other: 'paper' (the paper's runs, and ours at the full tier on the "
        "paper-matched scale), else our runs of one tier and scale, kept apart from the paper's."))
    not_comparable: str | None = Field(default=None, description=(
        "Why the group is not compared with the paper's humans (e.g. 'tier mini'); None: it may be."))


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
    environments: list[str] = Field(default_factory=list, description="The environments averaged over.")
    partial: bool = Field(default=False, description="Over fewer environments than the analysis has "
                                                     "(--coverage covered).")
    altered: int = Field(default=0, description="Runs among those used whose released score was changed.")
    hacks_altered: list[str] = Field(default_factory=list, description=(
        "Environments where a run used was treated as a reward hack (its released score changed)."))
    hacks_kept: list[str] = Field(default_factory=list, description=(
        "Environments where a run used is a suspected reward hack kept at its released score."))
    best: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        if self.method == "reached_at_budget":
            text = f"first {fmt_hours(self.budget_h)} of {fmt_hours(self.length_h)} attempts"
        else:
            text = f"{self.k} × {fmt_hours(self.length_h)}"
        return text + (f" ({len(self.environments)} envs)" if self.partial else "")


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
    """An agent against a human group at one total budget (over the environments the agent's split
    covers)."""

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
    environments: list[str] = Field(default_factory=list)
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


class DroppedCell(BaseModel):
    """Runs of one group and length left out of score@k: they do not cover every environment."""

    group: str
    length_h: float
    runs: int
    environments: list[str]
    missing: list[str]


class NormRow(BaseModel):
    """Our runs in one environment on both scales, with the constants behind each."""

    group: str
    env_id: str
    runs: int
    mean_measured: float
    mean_paper: float | None
    start: float | None = Field(description="The start's raw score measured for the runs (median over runs).")
    reference: float | None = Field(description="The reference's raw score measured for the runs.")
    paper_start: float | None
    paper_reference: float | None
    reference_on_paper_scale: float | None = Field(
        description="Our reference's paper-matched score: how much stronger (> 1) or weaker our reference "
                    "is than the paper's, on the paper's scale.")


class NormBudgetRow(BaseModel):
    """One of our groups' score@k at a budget on both scales."""

    group: str
    budget_h: float
    allocation: str
    measured: float | None
    paper: float | None


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


class ClaimRow(BaseModel):
    """One of the paper's headline claims, how our reproduction compares and why it differs."""

    key: str
    claim: str
    paper: str
    ours: str
    verdict: str
    why: str


class AlternativeRow(BaseModel):
    """The headline numbers under one treatment of the paper's data."""

    name: str
    flags: str = Field(description="The command-line options that give it (empty: the defaults).")
    description: str
    humans: int
    humans_by_env: dict[str, int]
    ratio_2h: float | None
    ratio_8h: float | None
    ratio_8h_ci: tuple[float, float] | None = None
    ratio_32h_humans: float | None
    ratio_32h_ci: tuple[float, float] | None = None
    human_mean: float
    human_nonzero: float
    human_ge_ref: float
    altered: int


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
    dropped: list[DroppedCell] = Field(default_factory=list)
    partial_humans: list[Allocation] = Field(
        default_factory=list, description="With --coverage covered: each human group's best split over each "
                                          "set of fewer environments an agent's split covers.")
    paper: PaperTreatment | None = Field(default=None, description="How the paper's data was read.")
    normalisation: list[NormRow] = Field(default_factory=list)
    normalisation_budgets: list[NormBudgetRow] = Field(default_factory=list)
    headline: list[HeadlineRow] | None = None
    claims: list[ClaimRow] | None = None
    alternatives: list[AlternativeRow] | None = None

    def curve(self, group: str) -> list[Allocation]:
        return [a for a in self.allocations if a.group == group and a.best]

    def best_at(self, group: str, budget_h: float) -> Allocation | None:
        return next((a for a in self.curve(group) if abs(a.budget_h - budget_h) < 1e-9), None)

    def group(self, name: str) -> GroupSummary | None:
        return next((g for g in self.groups if g.group == name), None)

    def cohorts(self) -> list[str]:
        """The cohorts present, the paper's first: each gets its own tables and figure panel."""
        found = list(dict.fromkeys(g.cohort for g in self.groups))
        return sorted(found, key=lambda c: c != PAPER_COHORT)

    def in_cohort(self, cohort: str) -> list[GroupSummary]:
        return [g for g in self.groups if g.cohort == cohort]

    def apart(self, cohort: str) -> str | None:
        """The mark of a cohort kept apart from the paper's humans (None for the paper's)."""
        why = next((g.not_comparable for g in self.in_cohort(cohort) if g.not_comparable), None)
        return not_comparable(why) if why else None


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


Candidate = tuple[Allocation, Array]


class _Engine:
    """Holds the attempts by group, environment and length, and the bootstrap replicates of each
    group's best allocation (for ratio intervals)."""

    def __init__(self, data: Dataset, environments: Sequence[str], budgets: Sequence[float], *, boots: int,
                 sims: int, seed: int, level: float, coverage: Coverage = "all") -> None:
        self.envs = list(environments)
        self.facts: dict[str, EnvFacts] = facts_for(self.envs, data.env_facts)
        self.hidden = frozenset(e for e, f in self.facts.items() if not f.score_visible)
        self.budgets = list(budgets)
        self.boots, self.sims, self.seed, self.level = boots, sims, seed, level
        self.coverage = coverage
        self.by_group: dict[str, list[Attempt]] = defaultdict(list)
        for a in data.attempts:
            if a.env_id in self.envs:
                self.by_group[a.group].append(a)
        suspects = data.paper.suspects if data.paper else []
        altered = {r.run_id for r in data.paper.altered} if data.paper else set()
        self.hacks = {r.run_id: r.run_id in altered for r in suspects}  # run id: whether its score changed
        self.replicates: dict[tuple[str, float], Array] = {}
        self.split_replicates: dict[tuple[str, float, float], Array] = {}  # every split, by its length
        self._on_envs: dict[tuple[str, float, tuple[str, ...]], Candidate | None] = {}

    def last(self, env: str) -> bool:
        """Whether a run's score at a time is its last valid scoring so far (else its best so far)."""
        return self.facts[env].last_counts

    def cell(self, group: str, env: str, length: float) -> list[Attempt]:
        return [a for a in self.by_group[group] if a.env_id == env and a.length_h == length]

    def cells(self, group: str, length: float, envs: Sequence[str] | None = None) -> dict[str, list[Attempt]]:
        """The runs of one length by environment, for the environments that have any."""
        return {env: c for env in (envs or self.envs) if (c := self.cell(group, env, length))}

    def lengths(self, group: str) -> list[float]:
        return sorted({a.length_h for a in self.by_group[group]})

    def covered(self, group: str, length: float) -> bool:
        return len(self.cells(group, length)) == len(self.envs)

    def _seed(self, *parts: object) -> int:
        return (self.seed * 1_000_003 + sum(ord(c) for c in repr(parts)) * 7919) % (2**32)

    def _candidate(self, group: str, is_human: bool, budget: float, length: float,
                   cells: dict[str, list[Attempt]]) -> Candidate | None:
        k = runs_for(budget, length)
        if k is not None:
            per_env = {env: np.array([a.score for a in c]) for env, c in cells.items()}
            method: Literal["best_of_k", "reached_at_budget"] = "best_of_k"
        elif is_human and budget < length and all(a.trajectory for c in cells.values() for a in c):
            k = 1
            per_env = {env: np.array([score_at(a.trajectory or [], budget, self.last(env)) for a in c])
                       for env, c in cells.items()}
            method = "reached_at_budget"
        else:
            return None
        envs = sorted(cells)
        est, reps = score_at_k(per_env, k, self.hidden, sims=self.sims, boots=self.boots,
                               seed=self._seed(group, budget, length, *([] if len(envs) == len(self.envs)
                                                                       else envs)), level=self.level)
        hacks = {(env, self.hacks[a.run_id]) for env, c in cells.items() for a in c if a.run_id in self.hacks}
        alloc = Allocation(group=group, budget_h=budget, length_h=length, k=k, method=method, estimate=est,
                           min_runs=min(len(c) for c in cells.values()), environments=envs,
                           partial=len(envs) < len(self.envs),
                           altered=sum(a.altered is not None for c in cells.values() for a in c),
                           hacks_altered=sorted(e for e, changed in hacks if changed),
                           hacks_kept=sorted(e for e, changed in hacks if not changed))
        return alloc, reps

    def allocations(self, group: str, is_human: bool) -> list[Allocation]:
        out: list[Allocation] = []
        for budget in self.budgets:
            candidates: list[Candidate] = []
            for length in self.lengths(group):
                cells = self.cells(group, length)
                if not cells or (len(cells) < len(self.envs) and self.coverage == "all"):
                    continue
                if (c := self._candidate(group, is_human, budget, length, cells)) is not None:
                    candidates.append(c)
            if not candidates:
                continue
            # A split over every environment beats one over some (their averages are not comparable).
            best, reps = max(candidates, key=lambda c: (len(c[0].environments), c[0].estimate.exact))
            best.best = True
            self.replicates[(group, budget)] = reps
            self.split_replicates.update({(group, budget, a.length_h): r for a, r in candidates})
            out.extend(a for a, _ in candidates)
        return out

    def dropped(self, group: str) -> list[DroppedCell]:
        if self.coverage == "covered":
            return []
        out = []
        for length in self.lengths(group):
            cells = self.cells(group, length)
            if len(cells) < len(self.envs):
                out.append(DroppedCell(group=group, length_h=length, runs=sum(len(c) for c in cells.values()),
                                       environments=sorted(cells),
                                       missing=[e for e in self.envs if e not in cells]))
        return out

    def on_envs(self, group: str, is_human: bool, budget: float, envs: Sequence[str]) -> Candidate | None:
        """The group's best split at `budget` over exactly `envs` (to compare with a split over those)."""
        key = (group, budget, tuple(sorted(envs)))
        if key not in self._on_envs:
            candidates = []
            for length in self.lengths(group):
                cells = self.cells(group, length, sorted(envs))
                if len(cells) == len(envs) and (c := self._candidate(group, is_human, budget, length, cells)):
                    candidates.append(c)
            self._on_envs[key] = max(candidates, key=lambda c: c[0].estimate.exact, default=None)
        return self._on_envs[key]

    def percentile(self, agent: str, alloc: Allocation, human: str) -> float | None:
        if alloc.method != "best_of_k":
            return None
        values = []
        for env in alloc.environments or self.envs:
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
        return _ratio_interval(a, b, self.level)

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


def _ratio_interval(num: Array, den: Array, level: float) -> tuple[float, float]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return percentile_interval(num / den, level)


def _kind(group: str, attempts: list[Attempt]) -> GroupKind:
    first = attempts[0]
    if first.is_human:
        return "human"
    if first.tier == PAPER_TIER:
        return "paper agent" if group in PAPER_AGENTS else "release model"
    return "ours"


def _label(group: str, kind: GroupKind) -> str:
    """How figures name a group: the paper's agents apart from the release's other models, and that the
    release pools scaffolds (ours carry the agent, our scaffold, in the group's name)."""
    return {"paper agent": f"{group} (paper's agent; Modular+AIDE pooled)",
            "release model": f"{group} (release, not in the paper's comparison)"}.get(kind, group)


def _summary(group: str, attempts: list[Attempt], envs: Sequence[str]) -> GroupSummary:
    scores = np.array([a.score for a in attempts])
    by_env: dict[str, int] = defaultdict(int)
    for a in attempts:
        by_env[a.env_id] += 1
    kind = _kind(group, attempts)
    scaffolds = sorted({a.scaffold for a in attempts if a.scaffold})
    cohort, why = cohort_of(attempts)
    on = {which: [a.scores.get(which) for a in attempts] for which in ("measured", "paper")}
    return GroupSummary(
        group=group, is_human=attempts[0].is_human, kind=kind, label=_label(group, kind),
        scaffold=", ".join(scaffolds) or ("not recorded" if kind in ("paper agent", "release model")
                                          else None),
        tiers=sorted({a.tier for a in attempts}), runs=len(attempts),
        runs_by_env=dict(sorted(by_env.items())), lengths_h=sorted({a.length_h for a in attempts}),
        mean_score=float(scores.mean()), frac_nonzero=float((scores > 0).mean()),
        frac_ge_reference=float((scores >= 1).mean()),
        mean_measured=_mean(on["measured"]) if kind == "ours" else None,
        mean_paper=_mean(on["paper"]) if kind == "ours" else None,
        altered=sum(a.altered is not None for a in attempts),
        tokens_per_run=_mean([a.tokens for a in attempts]),
        cost_per_run_usd=_mean([a.cost_usd for a in attempts]),
        env_tokens_per_run=_env_mean(attempts, "tokens"),
        env_cost_per_run_usd=_env_mean(attempts, "cost_usd"),
        gpu_hours_per_run=_mean([a.gpu_hours for a in attempts]),
        hours_used_per_run=_mean([a.hours_used for a in attempts]),
        with_trajectories=sum(a.trajectory is not None for a in attempts),
        missing=[e for e in envs if e not in by_env], cohort=cohort, not_comparable=why)


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
        runs = [a for env in alloc.environments for a in engine.cell(group, env, alloc.length_h)]
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


def _normalisation_rows(attempts: Sequence[Attempt]) -> list[NormRow]:
    """Our runs on both scales, per group and environment."""
    cells: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for a in attempts:
        if a.scores:
            cells[(a.group, a.env_id)].append(a)
    rows = []
    for (group, env), runs in sorted(cells.items()):
        starts = [a.constants.start for a in runs if a.constants]
        refs = [a.constants.reference for a in runs if a.constants]
        paper = next((a.paper_constants for a in runs if a.paper_constants), None)
        start = float(np.median(starts)) if starts else None
        ref = float(np.median(refs)) if refs else None
        on_paper = None
        if paper is not None and start is not None and ref is not None:
            on_paper = max(0.0, (ref - start) / (paper.reference - paper.start))
        rows.append(NormRow(group=group, env_id=env, runs=len(runs),
                            mean_measured=float(np.mean([a.scores["measured"] for a in runs])),
                            mean_paper=_mean([a.scores.get("paper") for a in runs]), start=start,
                            reference=ref,
                            paper_start=paper.start if paper else None,
                            paper_reference=paper.reference if paper else None,
                            reference_on_paper_scale=on_paper))
    return rows


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
