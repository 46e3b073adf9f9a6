"""score@k estimators against brute-force enumeration, interval coverage in simulation, time budgets,
score over time, and the analysis on hand-made attempts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from openrebench.analysis import (
    Attempt,
    Dataset,
    analyze,
    best_so_far,
    default_budgets,
    expected_max,
    interpolated,
    max_weights,
    prob_best_of_k_beats,
    runs_for,
    sample_best_of_k,
    score_at,
    score_at_k,
)
from openrebench.api import OpenRebenchError

CASES = [
    [0.3],
    [0.0, 1.0],
    [0.2, 0.2, 0.9],
    [0.0, 0.0, 0.5, 0.5, 1.7],
    [0.11, 0.7, 0.3, 0.05],
]


def brute_expected_max(values: list[float], k: int) -> float:
    """Average of max over every ordered k-tuple of indices (all n^k equally likely draws)."""
    tuples = list(itertools.product(range(len(values)), repeat=k))
    return float(np.mean([max(values[i] for i in t) for t in tuples]))


@pytest.mark.parametrize("values", CASES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_expected_max_equals_enumeration(values: list[float], k: int) -> None:
    assert expected_max(np.array(values), k) == pytest.approx(brute_expected_max(values, k), abs=1e-12)


def test_max_weights_are_a_distribution() -> None:
    for n, k in [(1, 1), (5, 1), (5, 3), (40, 64)]:
        w = max_weights(n, k)
        assert w.sum() == pytest.approx(1.0) and (w >= 0).all()
    assert max_weights(4, 1) == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError):
        max_weights(0, 1)


@pytest.mark.parametrize("values", CASES[1:])
def test_paper_sampling_estimate_converges_to_the_exact_one(values: list[float]) -> None:
    rng = np.random.default_rng(3)
    draws = sample_best_of_k(np.array(values), 3, 40_000, rng)
    se = draws.std() / np.sqrt(len(draws))
    assert abs(draws.mean() - expected_max(np.array(values), 3)) < 5 * se + 1e-12


def test_hidden_score_environment_takes_a_random_run_not_the_best() -> None:
    per_env = {"scaling_law": np.array([0.0, 1.0]), "optimize_kernel": np.array([0.0, 1.0])}
    est, _ = score_at_k(per_env, 4, {"scaling_law"}, sims=20_000, boots=50, seed=1)
    assert est.per_env["scaling_law"] == pytest.approx(0.5)
    assert est.per_env["optimize_kernel"] == pytest.approx(1 - 0.5**4)
    assert est.exact == pytest.approx((0.5 + 1 - 0.5**4) / 2)
    assert abs(est.sampled - est.exact) < 5 * est.sampled_se


@pytest.mark.parametrize("k", [1, 2, 3])
def test_chance_of_beating_humans_equals_enumeration(k: int) -> None:
    agent = [0.0, 0.4, 0.4, 0.9]
    humans = [0.0, 0.4, 0.5, 1.0]
    wins = []
    for t in itertools.product(agent, repeat=k):
        best = max(t)
        wins.append(np.mean([1.0 if best > h else 0.5 if best == h else 0.0 for h in humans]))
    assert prob_best_of_k_beats(np.array(agent), k, np.array(humans)) == pytest.approx(np.mean(wins))


def _population(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Score distributions shaped like RE-Bench's: a spike at 0, a bounded bump, a long right tail."""
    return {"spiky": np.concatenate([np.zeros(4000), rng.beta(2, 5, 6000)]),
            "tail": rng.gamma(2.0, 0.3, 10_000), "flat": rng.uniform(0, 1, 10_000)}


@pytest.mark.parametrize(("n", "k", "low"), [(40, 1, 0.91), (80, 4, 0.86)])
def test_bootstrap_interval_covers_the_truth_at_about_the_stated_rate(n: int, k: int, low: float) -> None:
    """95% percentile intervals, 500 simulated studies. The plug-in best-of-k is biased low when k is not
    small against n, so coverage falls below 95% there (the tables flag k above the runs available)."""
    rng = np.random.default_rng(7)
    population = _population(rng)
    truth = np.mean([expected_max(v, k) for v in population.values()])
    covered = 0
    for study in range(500):
        sample = {env: rng.choice(v, size=n) for env, v in population.items()}
        est, _ = score_at_k(sample, k, set(), sims=10, boots=400, seed=study)
        covered += est.ci_low <= truth <= est.ci_high
    assert low <= covered / 500 <= 0.99


def test_budgets_and_splits() -> None:
    assert default_budgets([0.5, 2, 8]) == [0.5, 1, 2, 4, 8, 16, 32]
    assert default_budgets([2], max_budget_h=8) == [2, 4, 8]
    assert runs_for(2, 0.5) == 4 and runs_for(32, 8) == 4
    assert runs_for(1, 2) is None and runs_for(3, 2) is None


def test_best_so_far_and_log_linear_interpolation() -> None:
    traj = [(0.0, 0.0), (0.1, 0.4), (0.2, None), (0.4, 0.2), (1.0, 0.8)]
    assert best_so_far(traj, last=False) == [(0.0, 0.0), (0.0, 0.0), (0.1, 0.4), (0.4, 0.4), (1.0, 0.8)]
    assert best_so_far(traj, last=True)[-2:] == [(0.4, 0.2), (1.0, 0.8)]
    assert score_at(traj, 0.5, last=False) == 0.4 and score_at(traj, 0.05, last=False) == 0.0
    grid = np.array([0.01, 0.1, np.sqrt(0.4), 1.0, 2.0])
    got = interpolated(traj, grid, last=False)
    # from (0.01, 0) to (0.1, 0.4) in log time; flat to 0.4 h; halfway in log time from 0.4 h to 1 h
    assert got == pytest.approx([0.0, 0.4, 0.6, 0.8, 0.8])


def _attempt(group: str, env: str, score: float, length: float = 0.5, human: bool = False,
             trajectory: list[tuple[float, float | None]] | None = None) -> Attempt:
    return Attempt(group=group, is_human=human, env_id=env, tier="mini", length_h=length, score=score,
                   trajectory=trajectory, source="test")


def test_analysis_of_hand_made_attempts() -> None:
    attempts = [_attempt("A", "optimize_kernel", s) for s in (0.0, 0.2, 0.6)]
    attempts += [_attempt("A", "scaling_law", s) for s in (0.1, 0.9)]
    attempts += [_attempt("A", "optimize_kernel", 0.9, length=2.0)]  # no 2 h runs on scaling_law
    attempts += [_attempt("B", "optimize_kernel", 0.5)]  # no scaling_law runs at all
    humans = [(0.5, [(0.0, 0.0), (1.0, 0.3), (6.0, 0.5)]), (1.0, [(0.0, 0.0), (3.0, 1.0)])]
    for env in ("optimize_kernel", "scaling_law"):
        attempts += [_attempt("H", env, s, length=8.0, human=True, trajectory=t) for s, t in humans]
    a = analyze(Dataset(attempts=attempts), boots=200, sims=500, seed=1)
    assert a.settings.budgets_h == [0.5, 1, 2, 4, 8, 16, 32]
    at2 = a.best_at("A", 2.0)
    assert at2 is not None and at2.k == 4 and at2.length_h == 0.5  # the 2 h runs do not cover scaling_law
    assert at2.estimate.exact == pytest.approx((expected_max(np.array([0.0, 0.2, 0.6]), 4) + 0.5) / 2)
    assert not a.curve("B") and any("B: no run length" in w for w in a.warnings)
    human2 = a.best_at("H", 2.0)  # humans below 8 h: the score their attempts had reached
    assert human2 is not None and human2.method == "reached_at_budget"
    assert human2.estimate.exact == pytest.approx(np.mean([0.3, 0.0]))
    assert a.best_at("H", 16.0).k == 2  # type: ignore[union-attr]
    comp = next(c for c in a.comparisons if c.agent == "A" and c.budget_h == 8.0)
    assert comp.human_score == pytest.approx(0.75)
    assert comp.ratio == pytest.approx(a.best_at("A", 8.0).estimate.exact / 0.75)  # type: ignore[union-attr]
    assert comp.ratio_ci is not None and comp.percentile is not None and 0 <= comp.percentile <= 100
    assert {c.group for c in a.time_curves} == {"H"}
    only_kernel = analyze(Dataset(attempts=attempts), environments=["optimize_kernel"], boots=50, sims=50)
    assert only_kernel.curve("B")
    with pytest.raises(OpenRebenchError, match="no attempts at environment"):
        analyze(Dataset(attempts=attempts), environments=["chat_rl"])
    with pytest.raises(OpenRebenchError, match="no attempts to analyse"):
        analyze(Dataset())
