"""Per-group descriptions of the runs that need no score@k: the group's summary, its per-environment
rows, its environments' own model use, its cost at each budget and its scores on both scales."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ._cohorts import cohort_of
from ._engine import _Engine
from ._model import Attempt, ModelUse
from ._paper import PAPER_AGENTS, PAPER_TIER
from ._results import Allocation, CostPoint, EnvModelRow, EnvRow, GroupKind, GroupSummary, NormRow


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
