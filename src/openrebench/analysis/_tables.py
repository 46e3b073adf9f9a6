"""The analysis as tables of strings: one definition, shown by the terminal (rich) and the HTML report."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._analysis import Analysis
from ._budget import fmt_hours

DISAGREE_Z = 3.0
# Percentile intervals of best-of-k undercover once k exceeds about a fifth of the runs
# (benchmarks/score_at_k_coverage.py: 95% nominal gives 81% at n = 20, k = 4 and 67% at k = 8).
FEW_RUNS_RATIO = 5


@dataclass
class TableSpec:
    key: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""
    numeric: set[int] = field(default_factory=set, repr=False)


def _prune(t: TableSpec) -> TableSpec:
    """Drop columns with nothing in them (e.g. cost columns for data without costs)."""
    keep = [i for i in range(len(t.columns)) if i == 0 or any(row[i] != "—" for row in t.rows)]
    return TableSpec(t.key, t.title, [t.columns[i] for i in keep], [[row[i] for i in keep] for row in t.rows],
                     t.caption, {j for j, i in enumerate(keep) if i in t.numeric})


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ci(lo: float, hi: float, digits: int = 2) -> str:
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _money(value: float | None) -> str:
    return "—" if value is None else f"${value:,.2f}"


def _count(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def groups_table(a: Analysis) -> TableSpec:
    t = TableSpec("groups", "Runs by group", ["group", "runs", "environments", "run lengths", "mean score",
                                              "> 0", "≥ reference", "agent tokens / run", "agent $ / run",
                                              "env model tokens / run", "env models $ / run", "GPU-h / run"],
                  numeric=set(range(4, 12)) | {1},
                  caption="Final normalised scores of single runs (0 = starting solution, 1 = reference). "
                          "Agent: the agent's own model calls (Inspect's usage). Env models: the "
                          "environment's model calls through the harness's gateway, kept apart.")
    for g in a.groups:
        envs = f"{len(g.runs_by_env)}/{len(a.settings.environments)}"
        t.rows.append([g.group, str(g.runs), envs, ", ".join(fmt_hours(x) for x in g.lengths_h),
                       _f(g.mean_score), f"{g.frac_nonzero:.0%}", f"{g.frac_ge_reference:.0%}",
                       _count(g.tokens_per_run), _money(g.cost_per_run_usd), _count(g.env_tokens_per_run),
                       _money(g.env_cost_per_run_usd), _f(g.gpu_hours_per_run)])
    return t


def budget_table(a: Analysis) -> TableSpec:
    budgets = a.settings.budgets_h
    t = TableSpec("budget", "score@k against total time budget (best split per group)",
                  ["group", *(fmt_hours(b) for b in budgets)], numeric=set(range(1, len(budgets) + 1)),
                  caption=f"Exact expected best of k runs, averaged over {len(a.settings.environments)} "
                          f"environment(s); {a.settings.level:.0%} percentile-bootstrap interval; the split "
                          "(k × run length) below. Humans below their attempt length: the score reached by "
                          "then.")
    for g in a.groups:
        cells = []
        for b in budgets:
            alloc = a.best_at(g.group, b)
            if alloc is None:
                cells.append("—")
                continue
            e = alloc.estimate
            cells.append(f"{e.exact:.2f} {_ci(e.ci_low, e.ci_high)}\n{alloc.label}")
        t.rows.append([g.group, *cells])
    return t


def comparison_table(a: Analysis, budgets: tuple[float, ...] = (2.0, 8.0, 32.0)) -> TableSpec:
    t = TableSpec("humans", "Agents against human experts",
                  ["agent", "budget", "agent score", "split", "humans", "agent / humans",
                   "beats a human attempt"],
                  numeric={2, 4, 5, 6},
                  caption="'beats a human attempt': chance that the agent's best of k beats a random human "
                          "attempt in the same environment, averaged over environments.")
    for c in a.comparisons:
        if c.budget_h not in budgets:
            continue
        ratio = "—" if c.ratio is None else f"{c.ratio:.2f}×" + (
            f" {_ci(*c.ratio_ci)}" if c.ratio_ci else "")
        t.rows.append([c.agent, fmt_hours(c.budget_h), _f(c.agent_score), c.agent_allocation,
                       _f(c.human_score),
                       ratio if c.ratio is not None else "— (no human score logs)",
                       "—" if c.percentile is None else f"{c.percentile:.0f}%"])
    return t


def per_env_table(a: Analysis) -> TableSpec:
    budget = 8.0 if 8.0 in a.settings.budgets_h else max(a.settings.budgets_h)
    groups = [g.group for g in a.groups if a.best_at(g.group, budget)]
    t = TableSpec("per_env", f"score@k per environment at a {fmt_hours(budget)} budget",
                  ["environment", *groups], numeric=set(range(1, len(groups) + 1)),
                  caption="Each group's best split at this budget (see the budget table).")
    for env in a.settings.environments:
        row = [env]
        for g in groups:
            alloc = a.best_at(g, budget)
            row.append(_f(alloc.estimate.per_env.get(env)) if alloc else "—")
        t.rows.append(row)
    return t


def runs_table(a: Analysis) -> TableSpec:
    t = TableSpec("runs", "Single runs per environment",
                  ["group", "environment", "run length", "runs", "mean", "median", "max", "> 0",
                   "≥ reference"],
                  numeric={3, 4, 5, 6, 7, 8})
    for r in a.per_env:
        t.rows.append([r.group, r.env_id, fmt_hours(r.length_h), str(r.runs), _f(r.mean), _f(r.median),
                       _f(r.max), f"{r.frac_nonzero:.0%}", f"{r.frac_ge_reference:.0%}"])
    return t


def estimator_table(a: Analysis, limit: int | None = 15) -> TableSpec:
    """Where the paper's sampling estimate and the exact one part, and where k outruns the data."""
    rows = []
    for al in a.allocations:
        e = al.estimate
        z = e.disagreement_z
        flags = []
        if abs(z) >= DISAGREE_Z:
            flags.append(f"sampling off by {z:+.1f} SE")
        if al.method == "best_of_k" and al.k > al.min_runs:
            flags.append(f"k = {al.k} > {al.min_runs} runs in an environment: leans on the best run; "
                         "interval unreliable")
        elif al.method == "best_of_k" and al.k > 1 and al.k * FEW_RUNS_RATIO > al.min_runs:
            flags.append(f"k = {al.k} against {al.min_runs} runs in an environment: the interval covers "
                         "less often than stated")
        if flags:
            rows.append((abs(z), al, "; ".join(flags)))
    rows.sort(key=lambda r: (-r[0], r[1].budget_h))
    n = len(a.allocations)
    worst = max((abs(al.estimate.disagreement_z) for al in a.allocations), default=0.0)
    t = TableSpec("estimators", "Sampling (paper) against exact score@k",
                  ["group", "budget", "split", "exact", "sampled ± SE", "z", "note"], numeric={3, 4, 5},
                  caption=f"{n} splits computed; largest |sampled − exact| is {worst:.1f} sampling SEs "
                          f"({a.settings.sims} draws each). Listed: |z| ≥ {DISAGREE_Z:g}, or k above a "
                          f"{FEW_RUNS_RATIO}th of the runs available"
                          + (f" (first {limit})" if limit and len(rows) > limit else "") + ".")
    for _, al, note in rows[:limit]:
        e = al.estimate
        t.rows.append([al.group, fmt_hours(al.budget_h), al.label, f"{e.exact:.3f}",
                       f"{e.sampled:.3f} ± {e.sampled_se:.3f}", f"{e.disagreement_z:+.1f}", note])
    return t


def allocation_table(a: Analysis) -> TableSpec:
    t = TableSpec("allocations", "Every split of every budget", ["group", "budget", "split", "exact",
                                                                 "sampled", "95% CI", "best"], numeric={3, 4})
    for al in a.allocations:
        e = al.estimate
        t.rows.append([al.group, fmt_hours(al.budget_h), al.label, f"{e.exact:.3f}", f"{e.sampled:.3f}",
                       _ci(e.ci_low, e.ci_high, 3), "✓" if al.best else ""])
    return t


def cost_table(a: Analysis) -> TableSpec:
    t = TableSpec("cost", "Score against cost (best split per budget)",
                  ["group", "budget", "split", "score", "agent tokens", "agent $", "env model tokens",
                   "env models $", "GPU-hours"],
                  numeric={3, 4, 5, 6, 7, 8},
                  caption="Cost of the k runs of one environment (means over runs of that length): the "
                          "agent's model calls, and apart from them the environment's own (the gateway's).")
    for c in a.cost:
        t.rows.append([c.group, fmt_hours(c.budget_h), c.allocation, _f(c.score), _count(c.tokens),
                       _money(c.dollars), _count(c.env_tokens), _money(c.env_dollars), _f(c.gpu_hours)])
    return t


def env_models_table(a: Analysis) -> TableSpec:
    t = TableSpec("env_models", "The environments' own models (through the harness's gateway)",
                  ["group", "role", "runs", "requests", "input tokens", "output tokens", "US$", "refused or "
                   "failed"], numeric={2, 3, 4, 5, 6, 7},
                  caption="Summed over the group's runs, from each run's gateway usage log "
                          "(<run>/gateway/usage.jsonl); apart from the agent's own model usage. US$ '—': a "
                          "model without a known price was called.")
    for r in a.env_models:
        u = r.usage
        t.rows.append([r.group, "all roles" if r.role is None else r.role, str(r.runs), f"{u.requests:,}",
                       f"{u.input_tokens:,}", f"{u.output_tokens:,}", _money(u.cost_usd), f"{u.failures:,}"])
    return t


def headline_table(a: Analysis) -> TableSpec | None:
    if not a.headline:
        return None
    t = TableSpec("headline", "The paper's headline numbers, recomputed from its public data",
                  ["quantity", "ours (95% CI)", "paper", "note"],
                  caption="Paper: Wijk et al., RE-Bench, arXiv 2411.15114. Data: METR/eval-analysis-public.")
    for r in a.headline:
        t.rows.append([r.label, r.reproduced, r.published, r.note])
    return t


def all_tables(a: Analysis, *, full: bool = False) -> list[TableSpec]:
    tables = [headline_table(a), groups_table(a), budget_table(a), comparison_table(a), per_env_table(a),
              estimator_table(a, None if full else 15)]
    if a.cost:
        tables.append(cost_table(a))
    if a.env_models:
        tables.append(env_models_table(a))
    if full:
        tables += [runs_table(a), allocation_table(a)]
    return [_prune(t) for t in tables if t is not None and t.rows]
