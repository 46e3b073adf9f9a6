"""The analysis's result: pydantic records of every group, split, comparison and curve, apart from the
code that computes them, so the tables, figures, JSON and report can read them alone."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from ._budget import fmt_hours
from ._cohorts import PAPER_COHORT, not_comparable
from ._estimators import Estimate
from ._model import ModelUse, Normalisation, PaperTreatment

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
