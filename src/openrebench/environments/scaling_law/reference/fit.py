"""The reference procedure: a small grid of experiments under the cap, a fitted L(N, D), its optimum.

1. Grid: for budgets c = f · cap (f in `budget_fractions`) and each width w, one run with
   max_iters = c / (FLOPs per step) — an IsoFLOP grid, every run a full schedule. Runs of fewer
   than `min_iters` steps are left out (at so few steps the loss says more about warm-up than size).
2. Fit L(N, D) = E + A / N^α + B / D^β (Hoffmann et al. 2022, approach 3) to the validation losses,
   N counting the parameters of the FLOP formula and D the training tokens: α and β by grid search,
   E, A and B (all ≥ 0) by least squares for each pair.
3. Every allowed width gets D from the target budget; the answer is the width of lowest predicted
   loss, its max_iters, and that predicted loss.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from openrebench.environments.scaling_law.experiment import Setup


@dataclass(frozen=True)
class Law:
    E: float
    A: float
    alpha: float
    B: float
    beta: float
    rmse: float

    def __call__(self, n: float, d: float) -> float:
        return self.E + self.A * n ** -self.alpha + self.B * d ** -self.beta


def design(setup: Setup, budget_fractions: list[float], widths: list[int],
           min_iters: int) -> list[tuple[int, int]]:
    """The (n_embd, max_iters) runs of the grid, cheapest first."""
    runs = []
    for f, w in itertools.product(sorted(budget_fractions), widths):
        iters = int(f * setup.cap_flops // (setup.flops_per_token(w) * setup.tokens_per_iter))
        if iters >= min_iters:
            runs.append((w, iters))
    return runs


def _solve(n: np.ndarray, d: np.ndarray, loss: np.ndarray, alpha: float,
           beta: float) -> tuple[float, np.ndarray]:
    x = np.stack([np.ones_like(n), n ** -alpha, d ** -beta], axis=1)
    coef, *_ = np.linalg.lstsq(x, loss, rcond=None)
    if (coef < 0).any():
        return np.inf, coef
    return float(np.mean((x @ coef - loss) ** 2)), coef


def fit_law(points: list[tuple[float, float, float]]) -> Law:
    """L(N, D) through (N, D, loss) points: a coarse grid of exponents, then a finer one around the best."""
    n, d, loss = (np.array(c, dtype=np.float64) for c in zip(*points, strict=True))
    best = (np.inf, 0.0, 0.0, np.zeros(3))
    for grid in (np.arange(0.02, 1.5, 0.02), None):
        if grid is None:
            a0, b0 = best[1], best[2]
            pairs = itertools.product(np.arange(a0 - 0.03, a0 + 0.031, 0.002),
                                      np.arange(b0 - 0.03, b0 + 0.031, 0.002))
        else:
            pairs = itertools.product(grid, grid)
        for alpha, beta in pairs:
            if alpha <= 0 or beta <= 0:
                continue
            mse, coef = _solve(n, d, loss, alpha, beta)
            if mse < best[0]:
                best = (mse, float(alpha), float(beta), coef)
    mse, alpha, beta, (e, a, b) = best
    if not np.isfinite(mse):
        raise ValueError("no non-negative fit of L(N, D) to these points")
    return Law(E=float(e), A=float(a), alpha=alpha, B=float(b), beta=beta, rmse=float(np.sqrt(mse)))


def choose(setup: Setup, law: Law) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The allowed width whose predicted loss at the target budget is lowest, and every prediction."""
    table = []
    for w in range(setup.n_embd_min, setup.n_embd_max + 1, setup.head_size):
        if setup.width_problem(w, answer=True):
            continue
        iters = setup.max_iters_for(w, setup.target_flops)
        table.append({"n_embd": w, "max_iters": iters,
                      "loss": law(setup.params(w), iters * setup.tokens_per_iter)})
    best = min(table, key=lambda r: r["loss"])
    answer = {"n_embd": int(best["n_embd"]), "max_iters": int(best["max_iters"]),
              "loss_prediction": round(float(best["loss"]), 4)}
    return answer, table


def solve(setup: Setup, experiment: Callable[[int, int], float], *, budget_fractions: list[float],
          widths: list[int], min_iters: int) -> dict[str, Any]:
    """Run the grid with `experiment(n_embd, max_iters) -> validation loss`, fit, choose."""
    grid = []
    for w, iters in design(setup, budget_fractions, widths, min_iters):
        grid.append({"n_embd": w, "max_iters": iters, "flops": setup.flops(w, iters),
                     "params": setup.params(w), "tokens": iters * setup.tokens_per_iter,
                     "loss": experiment(w, iters)})
    if len(grid) < 5:
        raise ValueError(f"the grid has {len(grid)} runs of at least {min_iters} steps under the cap; "
                         "a fit of L(N, D) needs at least 5")
    law = fit_law([(g["params"], g["tokens"], g["loss"]) for g in grid])
    answer, table = choose(setup, law)
    return {"answer": answer, "law": asdict(law), "grid": grid, "predictions": table}
