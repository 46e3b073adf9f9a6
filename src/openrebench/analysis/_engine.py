"""The engine of score@k: the attempts by group, environment and length, every way of splitting a budget
into k runs of a length (or a human's score reached at it), and the score-over-time curves, with the
bootstrap replicates the ratio intervals need."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ._budget import runs_for
from ._environments import facts_for
from ._estimators import Array, percentile_interval, prob_best_of_k_beats, score_at_k
from ._model import Attempt, Dataset, EnvFacts
from ._over_time import interpolated, score_at, time_grid
from ._results import Allocation, Coverage, DroppedCell, TimeCurve

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
