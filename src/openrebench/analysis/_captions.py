"""The figures' captions: what each plots, how it was computed, which rows were kept and how reward hacks
were treated; plain text from the analysis, apart from the matplotlib drawing."""

from __future__ import annotations

from ._budget import fmt_hours
from ._cohorts import PAPER_SIZE_TIERS
from ._paper import PAPER_AGENTS
from ._results import Analysis


def _humans_start(a: Analysis) -> float | None:
    starts = [c[0].budget_h for g in a.groups if g.is_human and (c := a.curve(g.group))]
    return min(starts) if starts else None


def _first_cohort(a: Analysis) -> tuple[set[str], str]:
    """The groups a one-cohort figure draws (the paper's cohort, else the first), and a sentence naming
    those it leaves out, kept apart from the paper's humans."""
    cohorts = a.cohorts()
    if not cohorts:
        return set(), ""
    keep = {g.group for g in a.in_cohort(cohorts[0])}
    left = [f"{', '.join(g.group for g in a.in_cohort(c))} ({a.apart(c) or c})" for c in cohorts[1:]]
    return keep, (" Left out of this figure, as they are not on the same footing: " + "; ".join(left)
                  + "; they have their own panel in the budget figure and their own tables." if left else "")


# Captions: what is plotted, how it was computed, which rows were kept, how reward hacks were treated.

def _estimator(a: Analysis) -> str:
    hidden = ", ".join(a.settings.hidden_score)
    return ("score@k is the exact expected best of k runs drawn with replacement from a group's runs of one "
            "length (order statistics"
            + (f"; in {hidden}, whose score the agent cannot see, a random one of the k" if hidden else "")
            + f"), averaged over the {len(a.settings.environments)} environments; bars are "
            f"{a.settings.level:.0%} percentile-bootstrap intervals over each environment's runs "
            f"({a.settings.boots} resamples). Each point is the group's best split k × L of the budget "
            "T = k·L.")


def _hacks_text(a: Analysis) -> str:
    """What the reward-hack marks mean, where any point carries one."""
    if a.paper is None or not any(p.hacks_altered or p.hacks_kept for p in a.allocations):
        return ""
    altered = {r.run_id for r in a.paper.altered}
    kept = [r for r in a.paper.suspects if r.run_id not in altered]
    text = "Marks on points whose runs include a suspected reward hack:"
    if altered:
        text += (" a cross where the run was treated as a reward hack (its score changed under --hacks "
                 f"{a.paper.hacks})")
    if kept:
        runs = ", ".join(f"{r.group} on {r.env_id} {r.released:.2f}" for r in kept)
        text += ("," if altered else "") + f" a ring where a suspect is kept at its released score ({runs})"
    return text + "."


def _scales_text(a: Analysis) -> str:
    """Our runs' scale, tier by tier, and which of them meet the paper's humans."""
    if not a.normalisation:
        return ""
    parts = []
    for tier, scale in (a.settings.scales or {"": a.settings.normalisation}).items():
        at = f" at tier {tier}" if tier else ""
        if scale == "paper" and tier in PAPER_SIZE_TIERS:
            parts.append(f"Our runs{at} are on the paper-matched scale (the paper's start-to-reference gap "
                         "from our measured start), as they are compared with the paper's humans.")
        elif scale == "paper":
            parts.append(f"Our runs{at} are on the paper-matched scale, but not compared with the paper's "
                         "humans.")
        else:
            parts.append(f"Our runs{at} are on the measured scale (our start and reference).")
    apart = [f"{a.apart(c)}: {', '.join(g.group for g in a.in_cohort(c))}" for c in a.cohorts() if a.apart(c)]
    if apart:
        parts.append("Kept apart from the paper's humans and agents (their own panel and tables, no ratio or "
                     "percentage against the humans): " + "; ".join(apart) + ".")
    return " ".join(parts)


def _rows(a: Analysis) -> str:
    parts = []
    if a.paper is not None:
        parts.append(a.paper.humans_text)
        altered = "; ".join(f"{r.group} on {r.env_id} {r.released:.2f} → {r.used:.2f}"
                            for r in a.paper.altered)
        parts.append(f"Reward hacks (--hacks {a.paper.hacks}): {a.paper.hacks_text}"
                     + (f"; altered (†): {altered}." if altered else "; no run altered."))
        parts.append(_hacks_text(a))
        parts.append("The release does not record scaffolds: each of its models pools its Modular and AIDE "
                     f"runs; the paper's agents ({', '.join(PAPER_AGENTS)}; solid colours, dashed) are kept "
                     "apart from the release's other models (muted, dotted).")
    if a.dropped:
        parts.append("Left out (runs of a length not covering every environment): " + "; ".join(
            f"{d.group} {d.runs} × {fmt_hours(d.length_h)} ({len(d.environments)} envs)" for d in a.dropped)
            + ". --coverage covered keeps them, averaged over the environments they cover (hollow markers).")
    elif a.settings.coverage == "covered":
        parts.append("Hollow markers: splits averaged over only the environments they cover (--coverage "
                     "covered).")
    parts.append(_scales_text(a))
    return " ".join(p for p in parts if p)


def _mixed(a: Analysis, groups: set[str]) -> str:
    """A warning where one figure draws groups of several cohorts (their scores mean different things)."""
    cohorts = {g.cohort for g in a.groups if g.group in groups}
    if len(cohorts) < 2:
        return ""
    names = sorted(a.apart(c) or "the paper's scale" for c in cohorts)
    return (" Curves of different cohorts (" + "; ".join(names) + ") are on different footings: read each on "
            "its own, not against the others.")


def _why_humans(a: Analysis) -> str:
    start = _humans_start(a)
    if start is None:
        return ""
    if start >= 8:
        return (" The human line starts at 8 h: humans made 8-hour attempts, and a budget below that needs "
                "the score each attempt had reached by then, which only its score log gives (the paper's "
                "release has none); from 8 h on it is the best of k = T/8 attempts.")
    return (f" Below their attempt length humans count the score their attempts had reached by then (from "
            f"their score logs), from {fmt_hours(start)}.")


def budget_caption(a: Analysis) -> str:
    apart = [c for c in a.cohorts() if a.apart(c)]
    panels = (" Each cohort not comparable with the paper's humans has a panel of its own, on its own axis, "
              "with no human of another cohort in it." if apart and len(a.cohorts()) > 1 else "")
    return (f"score@k against the total time budget per environment. {_estimator(a)}"
            + _why_humans(a) + panels + " " + _rows(a))


def k_caption(a: Analysis) -> str:
    return ("score@k against k for a fixed run length (one panel per length, every k the budgets allow; "
            f"splits over every environment only). {_estimator(a)} Humans appear in the 8-hour panel."
            + _first_cohort(a)[1] + " " + _rows(a))


def per_env_caption(a: Analysis) -> str:
    return ("Each environment on its own: the exact expected best of k at each group's best split of the "
            "budget (the split that is best on average, so per environment it is not always the best one), "
            f"with its {a.settings.level:.0%} percentile-bootstrap interval; the release's other models are "
            "left out for legibility (they are in the tables)." + _first_cohort(a)[1] + _why_humans(a) + " "
            + _rows(a))


def over_time_caption(a: Analysis) -> str:
    groups = sorted({c.group for c in a.time_curves})
    return ("Score over time within runs, from the runs' score logs: each run's best-so-far score (the "
            "last so far where a run's last valid scoring counts), interpolated linearly in log time between "
            f"scorings, averaged over runs and then over environments; shaded: {a.settings.level:.0%} "
            f"bootstrap interval. Groups with score logs: {', '.join(groups)}. The paper's release has no "
            "score logs, so its runs and humans are not here; a human's run appears when its Inspect log "
            "(the human agent) is given." + _mixed(a, set(groups)))


def percentile_caption(a: Analysis) -> str:
    return ("The chance that an agent's best of k at each budget beats a random single human attempt in the "
            "same environment (ties count half), averaged over the environments of its split; exact, from "
            "the runs' empirical distributions; each agent only against the humans of its own cohort (none "
            "against the paper's humans unless at the paper's size and scale). " + _rows(a))


def cost_caption(a: Analysis) -> str:
    return ("score@k at each budget's best split against what its k runs cost per environment: the agent's "
            "model dollars (else tokens) and GPU-hours (GPUs held × working time), means over runs times k."
            + _mixed(a, {c.group for c in a.cost}))
