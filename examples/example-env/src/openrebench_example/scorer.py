"""example_fit's scorer: in the scorer process, the agent's `predict` asked for the held-out xs in its own
solution host, its answers checked and compared with the held-out ys there."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from openrebench.api import ScoreResult, SolutionError, SolutionProcess, TierSpec, solution_cgroup

from .env import HELDOUT, HOST, FitParams


def score(spec: TierSpec[FitParams], solution: Path, protected: Path) -> ScoreResult:
    params = spec.params
    heldout = json.loads((protected / HELDOUT).read_text())
    xs, ys = [x for x, _ in heldout], [y for _, y in heldout]
    group = solution_cgroup()  # the solution's processes in a group of their own, where there is one
    try:
        with SolutionProcess(HOST, solution, cgroup=group) as host:
            reply = host.receive(params.timeout_s, "importing solution.py")
            if reply.get("ready") is True:
                reply = host.request({"xs": xs}, params.timeout_s, "predict(xs)")
    except SolutionError as e:
        return ScoreResult.invalid(f"Invalid: {e}")
    finally:
        if group is not None:
            group.close()
    predictions = _checked(reply, len(xs))
    if isinstance(predictions, str):
        return ScoreResult.invalid(f"Invalid: {predictions}")
    mse = sum((p - y) ** 2 for p, y in zip(predictions, ys, strict=True)) / len(ys)
    raw = math.log(max(mse, 1e-12))
    return ScoreResult(raw=raw, message=f"Valid: mean squared error {mse:.4f} on {len(ys)} held-out "
                                        f"points (score ln(MSE) = {raw:.3f}, lower is better).",
                       details={"mse": mse, "n_heldout": len(ys)})


def _checked(reply: Any, n: int) -> list[float] | str:
    """The host's predictions, trusting nothing of their shape; a one-line reason where they are unusable."""
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        return reply["error"][:2000]
    values = reply.get("predictions") if isinstance(reply, dict) else None
    if not isinstance(values, list) or len(values) != n:
        got = len(values) if isinstance(values, list) else type(values).__name__
        return f"predict(xs) must return a list of {n} numbers, got {got}"
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return "predict(xs) must return finite numbers only"
    return [float(v) for v in values]
