"""The analysis as tables of strings: one definition, shown by the terminal (rich) and the HTML report."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ._budget import fmt_hours
from ._cohorts import PAPER_SIZE_TIERS
from ._estimators import SE_FLOOR
from ._results import Analysis, GroupSummary

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


ALTERED_MARK = "†"


SCALE_NAMES = {"paper": "paper-matched", "measured": "measured"}


def _scale(a: Analysis, tiers: set[str] | None = None) -> str:
    """Our runs' scale (of those `tiers`, where given), by tier where the tiers differ."""
    scales = {t: s for t, s in a.settings.scales.items() if tiers is None or t in tiers}
    if not scales:
        return SCALE_NAMES[a.settings.normalisation]
    if len(set(scales.values())) == 1:
        return SCALE_NAMES[next(iter(scales.values()))]
    return ", ".join(f"{SCALE_NAMES[s]} at tier {t}" for t, s in scales.items())


def _ours_on(a: Analysis, groups: list[GroupSummary] | None = None) -> str:
    """Which scale our runs (those among `groups`, where given) are on, where there are any."""
    tiers = None if groups is None else {t for g in groups for t in g.tiers if t in a.settings.scales}
    if not a.normalisation or tiers == set():
        return ""
    return f" Our runs on the {_scale(a, tiers)} scale."


def _by_cohort(a: Analysis, key: str, make: Callable[[Analysis, list[GroupSummary]], TableSpec]
               ) -> list[TableSpec]:
    """One table per cohort: the paper's (or the first) under `key`, and each cohort kept apart from the
    paper's humans in a table of its own, marked so in its title and caption."""
    out = []
    for i, cohort in enumerate(a.cohorts()):
        t = make(a, a.in_cohort(cohort))
        if i:
            t.key = f"{key}_{re.sub(r'[^a-z0-9]+', '_', cohort.lower()).strip('_')}"
        if (apart := a.apart(cohort)) is not None:
            t.title += f": {apart}"
            t.caption = (f"{apart[0].upper()}{apart[1:]}: our runs at {cohort}, shown apart and never set "
                         "against the paper's humans or agents. " + t.caption)
        out.append(t)
    return out


def _marked(a: Analysis, group: str) -> str:
    g = a.group(group)
    return group + (f" {ALTERED_MARK}" if g is not None and g.altered else "")


def altered_caption(a: Analysis, groups: list[GroupSummary] | None = None) -> str:
    """What the † mark means, where any run (of `groups`, where given) was altered (else empty)."""
    if a.paper is None or not a.paper.altered or (groups is not None and not any(g.altered for g in groups)):
        return ""
    runs = "; ".join(f"{r.group} on {r.env_id} {r.released:.2f} → {r.used:.2f}" for r in a.paper.altered)
    return (f" {ALTERED_MARK} {len(a.paper.altered)} run(s) altered as reward hacks (--hacks "
            f"{a.paper.hacks}): {runs}.")


def groups_tables(a: Analysis) -> list[TableSpec]:
    return _by_cohort(a, "groups", groups_table)


def groups_table(a: Analysis, groups: list[GroupSummary] | None = None) -> TableSpec:
    t = TableSpec("groups", "Runs by group", ["group", "kind", "runs", "environments", "run lengths",
                                              "mean score", "> 0", "≥ reference", "agent tokens / run",
                                              "agent $ / run", "env model tokens / run", "env models $ / run",
                                              "GPU-h / run"],
                  numeric=set(range(5, 13)) | {2},
                  caption="Final normalised scores of single runs (0 = starting solution, 1 = reference)."
                          + _ours_on(a, groups) + " Kind: ours (with the agent, our scaffold), the paper's "
                          "agents, or the release's other models (the release records no scaffold: each "
                          "model pools its Modular and AIDE runs). Agent: the agent's own model calls "
                          "(Inspect's usage). Env models: the environment's model calls through the "
                          "harness's gateway, kept apart." + altered_caption(a, groups))
    kinds = {"human": "human", "paper agent": "paper's agent", "release model": "release only"}
    for g in a.groups if groups is None else groups:
        envs = f"{len(g.runs_by_env)}/{len(a.settings.environments)}"
        kind = kinds.get(g.kind) or (f"ours ({g.scaffold})" if g.scaffold else "ours")
        t.rows.append([_marked(a, g.group), kind, str(g.runs), envs,
                       ", ".join(fmt_hours(x) for x in g.lengths_h),
                       _f(g.mean_score), f"{g.frac_nonzero:.0%}", f"{g.frac_ge_reference:.0%}",
                       _count(g.tokens_per_run), _money(g.cost_per_run_usd), _count(g.env_tokens_per_run),
                       _money(g.env_cost_per_run_usd), _f(g.gpu_hours_per_run)])
    return t


def budget_tables(a: Analysis) -> list[TableSpec]:
    return _by_cohort(a, "budget", budget_table)


def budget_table(a: Analysis, groups: list[GroupSummary] | None = None) -> TableSpec:
    budgets = a.settings.budgets_h
    t = TableSpec("budget", "score@k against total time budget (best split per group)",
                  ["group", *(fmt_hours(b) for b in budgets)], numeric=set(range(1, len(budgets) + 1)),
                  caption=f"Exact expected best of k runs, averaged over {len(a.settings.environments)} "
                          f"environment(s) (a split marked '(n envs)' over the n it covers: --coverage "
                          f"covered); {a.settings.level:.0%} percentile-bootstrap interval; the split "
                          "(k × run length) below. Humans below their attempt length: the score reached by "
                          "then (needs score logs; the paper's release has none, so its humans start at 8 h)."
                          + _ours_on(a, groups) + altered_caption(a, groups))
    for g in a.groups if groups is None else groups:
        cells = []
        for b in budgets:
            alloc = a.best_at(g.group, b)
            if alloc is None:
                cells.append("—")
                continue
            e = alloc.estimate
            mark = f" {ALTERED_MARK}" if alloc.altered else ""
            cells.append(f"{e.exact:.2f} {_ci(e.ci_low, e.ci_high)}{mark}\n{alloc.label}")
        t.rows.append([g.group, *cells])
    return t


def comparison_table(a: Analysis, budgets: tuple[float, ...] = (2.0, 8.0, 32.0)) -> TableSpec:
    several = len({c.human for c in a.comparisons}) > 1
    apart = [g.group for g in a.groups if g.not_comparable and not g.is_human]
    compared = {c.agent for c in a.comparisons} | {c.human for c in a.comparisons}
    members = [g for g in a.groups if g.group in compared]
    t = TableSpec("humans", "Agents against human experts",
                  ["agent", "budget", "agent score", "split", "human group", "humans", "agent / humans",
                   "beats a human attempt"],
                  numeric={2, 5, 6, 7},
                  caption="Humans on the same environments as the agent's split. 'beats a human attempt': "
                          "chance that the agent's best of k beats a random human attempt in the same "
                          "environment, averaged over environments. Agents are set only against humans of "
                          "their own cohort: the paper's humans only against the paper's agents and our "
                          "full-tier runs on the paper-matched scale." + _ours_on(a, members)
                          + (f" Not compared with the paper's humans: {', '.join(apart)}." if apart else "")
                          + altered_caption(a))
    for c in a.comparisons:
        if c.budget_h not in budgets:
            continue
        ratio = "—" if c.ratio is None else f"{c.ratio:.2f}×" + (
            f" {_ci(*c.ratio_ci)}" if c.ratio_ci else "")
        t.rows.append([_marked(a, c.agent), fmt_hours(c.budget_h), _f(c.agent_score), c.agent_allocation,
                       c.human if several else "—", _f(c.human_score),
                       ratio if c.ratio is not None else "— (no human score logs)" if c.human_score is None
                       else f"— (humans below {SE_FLOOR:g})",
                       "—" if c.percentile is None else f"{c.percentile:.0f}%"])
    return t


def per_env_tables(a: Analysis) -> list[TableSpec]:
    return _by_cohort(a, "per_env", per_env_table)


def per_env_table(a: Analysis, members: list[GroupSummary] | None = None) -> TableSpec:
    budget = 8.0 if 8.0 in a.settings.budgets_h else max(a.settings.budgets_h)
    groups = [g.group for g in (a.groups if members is None else members) if a.best_at(g.group, budget)]
    t = TableSpec("per_env", f"score@k per environment at a {fmt_hours(budget)} budget",
                  ["environment", *groups], numeric=set(range(1, len(groups) + 1)),
                  caption=f"Each group's best split at this budget (see the budget table), with its "
                          f"{a.settings.level:.0%} percentile-bootstrap interval." + _ours_on(a, members)
                          + altered_caption(a, members))
    for env in a.settings.environments:
        row = [env]
        for g in groups:
            alloc = a.best_at(g, budget)
            value = alloc.estimate.per_env.get(env) if alloc else None
            ci = alloc.estimate.per_env_ci.get(env) if alloc else None
            row.append("—" if value is None else f"{value:.2f}" + (f" {_ci(*ci)}" if ci else ""))
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
    floored = sum(al.estimate.se_floored for al in a.allocations)
    t = TableSpec("estimators", "Sampling (paper) against exact score@k",
                  ["group", "budget", "split", "exact", "sampled ± SE", "z", "note"], numeric={3, 4, 5},
                  caption=f"{n} splits computed; largest |sampled − exact| is {worst:.1f} sampling SEs "
                          f"({a.settings.sims} draws each). Listed: |z| ≥ {DISAGREE_Z:g}, or k above a "
                          f"{FEW_RUNS_RATIO}th of the runs available"
                          + (f" (first {limit})" if limit and len(rows) > limit else "") + "."
                          + (f" The SE is floored at {SE_FLOOR:g} normalised units (this table's last "
                             f"digit), as it was in {floored} of the {n} splits (marked 'floor'): "
                             "(near-)identical runs give an SE of round-off alone, which would turn a "
                             "round-off difference into an enormous z." if floored else ""))
    for _, al, note in rows[:limit]:
        e = al.estimate
        se = f"{SE_FLOOR:.3f} (floor)" if e.se_floored else f"{e.sampled_se:.3f}"
        t.rows.append([al.group, fmt_hours(al.budget_h), al.label, f"{e.exact:.3f}",
                       f"{e.sampled:.3f} ± {se}", f"{e.disagreement_z:+.1f}", note])
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


def claims_table(a: Analysis) -> TableSpec | None:
    if not a.claims:
        return None
    t = TableSpec("claims", "This reproduction against the paper's headline claims",
                  ["claim", "paper", "ours", "verdict", "why"],
                  caption="Ours: the paper's data as released, read as the 'data treatment' row says; "
                          "the other treatments are in the table of alternatives.")
    for c in a.claims:
        t.rows.append([c.claim, c.paper, c.ours, c.verdict, c.why])
    return t


def treatment_table(a: Analysis) -> TableSpec | None:
    """Human attempts kept per environment under this analysis's choice and the alternatives."""
    if a.paper is None:
        return None
    names = {"": "real, 7-9 h", "--human-hours all": "real, all lengths",
             "--human-rows likely71": "likely71, 7-9 h",
             "--human-rows likely71 --human-hours all": "likely71, all lengths"}
    choices = [(names[r.flags], r.humans_by_env) for r in a.alternatives or [] if r.flags in names]
    t = TableSpec("human_counts", "Human attempts kept per environment",
                  ["environment", "released", "kept here", "left out here", *(c for c, _ in choices)],
                  numeric=set(range(1, 4 + len(choices))) - {3},
                  caption=a.paper.humans_text + " Columns after the first three: attempts each choice of "
                          "--human-rows and --human-hours keeps.")
    for c in a.paper.human_counts:
        left = [f"{n} {what}" for n, what in ((c.too_short, "shorter"), (c.too_long, "longer"),
                                             (c.not_selected, "not in the rows")) if n]
        t.rows.append([c.env_id, str(c.released), str(c.kept), ", ".join(left) or "—",
                       *(str(by_env.get(c.env_id, 0)) for _, by_env in choices)])
    return t


def altered_table(a: Analysis) -> TableSpec | None:
    if a.paper is None or not a.paper.suspects:
        return None
    changed = {r.run_id: r for r in a.paper.altered}
    t = TableSpec("hacks", "Suspected reward hacks", ["run", "group", "environment", "run length", "released",
                                                      "used here", "why suspected"], numeric={4, 5},
                  caption=f"--hacks {a.paper.hacks}: {a.paper.hacks_text}. The paper scored runs it judged "
                          "as cheating 0 after review (Wijk et al., arXiv 2411.15114); the release keeps "
                          "their scores. --hacks keep, zero or cap choose otherwise.")
    for r in a.paper.suspects:
        used = changed[r.run_id].used if r.run_id in changed else r.released
        t.rows.append([r.run_id, r.group, r.env_id, fmt_hours(r.length_h), f"{r.released:.2f}", f"{used:.2f}",
                       r.reason])
    return t


def dropped_table(a: Analysis) -> TableSpec | None:
    if not a.dropped:
        return None
    t = TableSpec("dropped", "Runs left out of score@k",
                  ["group", "run length", "runs", "environments covered", "missing"], numeric={2},
                  caption="score@k averages over every environment of the analysis, so a run length without "
                          "runs in all of them is left out; --coverage covered averages over the "
                          "environments covered instead (marked '(n envs)').")
    for d in a.dropped:
        t.rows.append([d.group, fmt_hours(d.length_h), str(d.runs), f"{len(d.environments)}: "
                       + ", ".join(d.environments), ", ".join(d.missing)])
    return t


def _small_tiers(a: Analysis) -> str:
    """The caveat of a paper-matched score at a tier smaller than the paper's, where there are such runs."""
    tiers = sorted({t for t in a.settings.scales if t not in PAPER_SIZE_TIERS})
    if not tiers:
        return ""
    return (f" At tier {', '.join(tiers)} the paper-matched score takes the full tier's paper constants for "
            "reference only: the task is smaller than the paper's, so it is not comparable with the paper's "
            "humans.")


def normalisation_table(a: Analysis) -> TableSpec | None:
    if not a.normalisation:
        return None
    t = TableSpec("normalisation", "Our runs on both scales",
                  ["group", "environment", "runs", "mean, measured", "mean, paper-matched", "start (raw)",
                   "reference (raw)", "paper's start → reference", "our reference, paper-matched"],
                  numeric={2, 3, 4, 5, 6, 8},
                  caption="Measured: 0 = our start, 1 = our reference, both measured on our hardware. "
                          "Paper-matched: the improvement over our start in units of the paper's "
                          "start-to-reference gap (raw-score units), so that a score means what it means for "
                          f"the paper's humans. This analysis uses the {_scale(a)} scale." + _small_tiers(a))
    for r in a.normalisation:
        paper = (f"{r.paper_start:.3f} → {r.paper_reference:.3f}" if r.paper_start is not None
                 and r.paper_reference is not None else "—")
        t.rows.append([r.group, r.env_id, str(r.runs), _f(r.mean_measured), _f(r.mean_paper),
                       _f(r.start, 3), _f(r.reference, 3), paper, _f(r.reference_on_paper_scale)])
    return t


def normalisation_budget_table(a: Analysis) -> TableSpec | None:
    if not a.normalisation_budgets:
        return None
    t = TableSpec("normalisation_budgets", "Our score@k on both scales",
                  ["group", "budget", "split", "measured", "paper-matched"], numeric={3, 4},
                  caption=f"Exact score@k of our groups (this analysis uses the {_scale(a)} scale)."
                          + _small_tiers(a))
    for r in a.normalisation_budgets:
        t.rows.append([r.group, fmt_hours(r.budget_h), r.allocation, _f(r.measured), _f(r.paper)])
    return t


def alternatives_table(a: Analysis) -> TableSpec | None:
    if not a.alternatives:
        return None
    t = TableSpec("alternatives", "The headline under other treatments of the paper's data",
                  ["treatment", "options", "humans", "agent / humans, 2 h (bound)", "agent / humans, 8 h",
                   "humans / agent, 32 h", "human mean, > 0, ≥ ref", "runs altered"],
                  numeric={2, 3, 4, 5, 7},
                  caption="The paper's data alone, all seven environments; each row changes one choice of "
                          "the default (or two). Paper: ≈4×, < 1 (narrowly), ≈2×; 0.64, 82%, 24%.")

    def ratio(v: float | None, ci: tuple[float, float] | None = None) -> str:
        return "—" if v is None else f"{v:.2f}×" + (f" {_ci(*ci)}" if ci else "")

    for r in a.alternatives:
        t.rows.append([r.name, r.flags or "(defaults)", str(r.humans), ratio(r.ratio_2h),
                       ratio(r.ratio_8h, r.ratio_8h_ci), ratio(r.ratio_32h_humans, r.ratio_32h_ci),
                       f"{r.human_mean:.2f}, {r.human_nonzero:.0%}, {r.human_ge_ref:.0%}", str(r.altered)])
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


def treatment_tables(a: Analysis) -> list[TableSpec]:
    """How the data was read: human attempts kept, reward hacks, runs left out, the two scales."""
    tables = (treatment_table(a), altered_table(a), dropped_table(a), normalisation_table(a),
              normalisation_budget_table(a))
    return [_prune(t) for t in tables if t is not None and t.rows]


def all_tables(a: Analysis, *, full: bool = False) -> list[TableSpec]:
    tables = [claims_table(a), headline_table(a), *treatment_tables(a), *groups_tables(a), *budget_tables(a),
              comparison_table(a), *per_env_tables(a), alternatives_table(a),
              estimator_table(a, None if full else 15)]
    if a.cost:
        tables.append(cost_table(a))
    if a.env_models:
        tables.append(env_models_table(a))
    if full:
        tables += [runs_table(a), allocation_table(a)]
    return [_prune(t) for t in tables if t is not None and t.rows]
