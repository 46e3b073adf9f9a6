"""score@k estimators: the paper's sampling estimate, the exact expected maximum, bootstrap intervals.

score@k for one environment is the expected best of k runs drawn with replacement from the runs we
have. The paper estimates it by sampling; the same quantity has a closed form from order statistics
(below), so the sampling noise can be measured instead of guessed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, computed_field

Array = NDArray[np.float64]

# The floor of the sampling estimate's standard error, in normalised units (a thousandth of the
# start-to-reference gap). Runs with (near-)identical scores give a sampling SE of round-off (~1e-18), and
# a round-off difference over it read as z = 14 to 44 for two identical runs. A thousandth is the last digit
# the estimator table prints (the score@k tables print two), so a disagreement the floor hides is one the
# tables cannot show. It is small enough to keep the check's teeth on real data: at 2,000 draws the paper's
# splits have SEs of 1e-5 to 4e-3, so under a floor of 0.01 a disagreement of three of their own SEs would
# never reach |z| = 3.
SE_FLOOR = 1e-3


def max_weights(n: int, k: int) -> Array:
    """Probability that the i-th smallest of n values is the maximum of k draws with replacement.

    P(max <= x_(i)) = (i/n)^k, so the i-th order statistic gets (i/n)^k - ((i-1)/n)^k. Ties are fine:
    tied values share their total weight, which is all the expectation needs.
    """
    if n < 1 or k < 1:
        raise ValueError(f"need n >= 1 and k >= 1 (got n={n}, k={k})")
    cdf = (np.arange(n + 1, dtype=np.float64) / n) ** k
    return np.diff(cdf)


def expected_max(values: Array, k: int) -> float:
    """Exact E[max of k draws with replacement from `values`]: no sampling noise."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    return float(x @ max_weights(len(x), k))


def sample_best_of_k(values: Array, k: int, sims: int, rng: np.random.Generator,
                     hidden: bool = False) -> Array:
    """The paper's way, one environment: `sims` draws of k runs, each giving its best (or, for an
    environment whose score is hidden from the agent, a random one of the k)."""
    x = np.asarray(values, dtype=np.float64)
    if hidden:
        return x[rng.integers(0, len(x), size=sims)]
    return x[rng.integers(0, len(x), size=(sims, k))].max(axis=1)


def bootstrap_expected_max(values: Array, k: int, boots: int, rng: np.random.Generator) -> Array:
    """E[max of k] recomputed on `boots` resamples (with replacement) of the runs."""
    x = np.asarray(values, dtype=np.float64)
    resampled = np.sort(x[rng.integers(0, len(x), size=(boots, len(x)))], axis=1)
    return resampled @ max_weights(len(x), k)


def percentile_interval(replicates: Array, level: float = 0.95) -> tuple[float, float]:
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


class Estimate(BaseModel):
    """score@k averaged over environments, by both estimators, with a 95% percentile-bootstrap CI."""

    exact: float
    sampled: float
    sampled_se: float
    ci_low: float
    ci_high: float
    per_env: dict[str, float]
    per_env_ci: dict[str, tuple[float, float]] = {}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def se_floored(self) -> bool:
        """Whether the sampling SE is below SE_FLOOR, so that the z uses the floor (near-identical runs)."""
        return self.sampled_se < SE_FLOOR

    @computed_field  # type: ignore[prop-decorator]
    @property
    def disagreement_z(self) -> float:
        """How many sampling standard errors separate the two estimators (large means: look); the SE is
        floored at SE_FLOOR, so that round-off over round-off never reads as a disagreement."""
        return (self.sampled - self.exact) / max(self.sampled_se, SE_FLOOR)


def score_at_k(per_env: Mapping[str, Array], k: int, hidden: frozenset[str] | set[str], *, sims: int,
               boots: int, seed: int, level: float = 0.95) -> tuple[Estimate, Array]:
    """score@k over environments (mean of per-environment values) and its bootstrap replicates.

    The interval resamples each environment's runs independently (environments are fixed, runs are
    the random part) and uses the exact estimator inside, so it carries no sampling noise of its own.
    """
    if not per_env:
        raise ValueError("no environments")
    rng = np.random.default_rng(seed)
    exact: dict[str, float] = {}
    per_env_ci: dict[str, tuple[float, float]] = {}
    sampled = np.zeros(sims)
    replicates = np.zeros(boots)
    for env in sorted(per_env):
        kk = 1 if env in hidden else k
        values = np.asarray(per_env[env], dtype=np.float64)
        exact[env] = expected_max(values, kk)
        sampled += sample_best_of_k(values, k, sims, rng, hidden=env in hidden)
        env_replicates = bootstrap_expected_max(values, kk, boots, rng)
        per_env_ci[env] = percentile_interval(env_replicates, level)
        replicates += env_replicates
    n = len(per_env)
    sampled /= n
    replicates /= n
    lo, hi = percentile_interval(replicates, level)
    est = Estimate(exact=float(np.mean(list(exact.values()))), sampled=float(sampled.mean()),
                   sampled_se=float(sampled.std(ddof=1) / np.sqrt(sims)) if sims > 1 else 0.0,
                   ci_low=lo, ci_high=hi, per_env=exact, per_env_ci=per_env_ci)
    return est, replicates


def prob_best_of_k_beats(agent: Array, k: int, others: Array) -> float:
    """P(best of k draws from `agent` > a random value of `others`), ties counting one half.

    Exact: P(max <= x) = F(x)^k with F the empirical distribution of `agent`.
    """
    a = np.sort(np.asarray(agent, dtype=np.float64))
    h = np.asarray(others, dtype=np.float64)
    n = len(a)
    f_le = np.searchsorted(a, h, side="right") / n
    f_lt = np.searchsorted(a, h, side="left") / n
    p_gt = 1 - f_le**k
    p_eq = f_le**k - f_lt**k
    return float(np.mean(p_gt + 0.5 * p_eq))
