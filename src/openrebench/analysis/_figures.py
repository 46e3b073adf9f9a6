"""Paper-style figures (matplotlib, Agg, no pyplot state): each returns PNG bytes, or None without data,
and has a caption saying what is plotted and how it was computed.

Sizes: the report's page is about 1,140 pixels wide and figures are drawn at 100 dpi no wider than
11.4 inches, so they are shown at about their own size and the 10-11 point text stays readable."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ._budget import fmt_hours
from ._captions import (
    _first_cohort,
    budget_caption,
    cost_caption,
    k_caption,
    over_time_caption,
    per_env_caption,
    percentile_caption,
)
from ._results import Allocation, Analysis, GroupSummary

HUMAN_COLOR = "black"
# Ours first (bold colours), then the paper's agents, then the release's other models (muted).
OURS = ["#1f77b4", "#2ca02c", "#9467bd", "#393b79", "#637939", "#843c39"]
PAPER_COLORS = ["#d62728", "#ff7f0e", "#8c2d04"]
RELEASE = ["#17becf", "#8c564b", "#bcbd22", "#e377c2", "#7f7f7f", "#6b6ecf", "#7b4173"]
MARKERS = ["o", "s", "D", "^", "v", "P", "X", "<", ">", "h"]
STYLES = {"human": "-", "ours": "-", "paper agent": "--", "release model": ":"}
DPI = 100
WIDTH_IN = 11.4
TIME_TICKS_H = [1 / 60, 5 / 60, 15 / 60, 0.5, 1, 2, 4, 8, 16, 32, 64]
# Points whose runs include a suspected reward hack: a cross where the treatment (--hacks) changed its
# score, a ring where it kept the released one; black, so that they read on any group's colour.
HACK_MARKS = {"altered": {"marker": "x", "ms": 11, "mew": 2.0, "color": "black"},
              "kept": {"marker": "o", "ms": 13, "mew": 1.3, "mfc": "none", "mec": "black", "color": "black"}}
RC = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10,
      "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 13}


@contextmanager
def _rc() -> Iterator[None]:
    with matplotlib.rc_context(RC):
        yield


def _style(ax: Axes) -> None:
    ax.grid(True, which="major", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


class _Look:
    """One colour, marker and line style per group, the same in every figure."""

    def __init__(self, a: Analysis) -> None:
        self.color: dict[str, str] = {}
        self.marker: dict[str, str] = {}
        self.style: dict[str, str] = {}
        self.label: dict[str, str] = {}
        counters = {"ours": 0, "paper agent": 0, "release model": 0}
        palettes = {"ours": OURS, "paper agent": PAPER_COLORS, "release model": RELEASE}
        for i, g in enumerate(a.groups):
            if g.is_human:
                self.color[g.group] = HUMAN_COLOR
            else:
                n = counters[g.kind]
                self.color[g.group] = palettes[g.kind][n % len(palettes[g.kind])]
                counters[g.kind] += 1
            self.marker[g.group] = MARKERS[i % len(MARKERS)]
            self.style[g.group] = STYLES[g.kind]
            self.label[g.group] = (g.label or g.group) + (" †" if g.altered else "")
        self.offset = {g.group: i for i, g in enumerate(a.groups)}
        self.n = max(1, len(a.groups))

    def dodge(self, group: str, x: float, spread: float = 0.18) -> float:
        """x moved a little (in log2 units) so that overlapping points and bars stay apart."""
        step = spread / self.n
        return x * 2 ** ((self.offset[group] - (self.n - 1) / 2) * step)


def _hours_axis(ax: Axes, ticks: list[float], label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_hours(x).replace(" ", "\u202f")))
    ax.set_xlabel(label)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _legend(fig: Figure, axes: list[Axes], ncols: int = 2, order: list[str] | None = None,
            into: Axes | None = None) -> None:
    """One legend for all panels, entries in the groups' order; in the spare panel `into` if given."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    if not seen:
        return
    labels = sorted(seen, key=lambda x: next((i for i, o in enumerate(order or []) if x.startswith(o)), 99))
    handles = [seen[x] for x in labels]
    if into is not None:
        into.set_visible(True)
        into.axis("off")
        into.legend(handles, labels, loc="center", frameon=False, fontsize=10)
        return
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False)


def _bars(ys: list[float], intervals: list[tuple[float, float]]) -> list[list[float]]:
    """Error bars below and above each point. The percentile bootstrap of a best of k is biased low (a
    resample has fewer distinct runs), so with few resamples or a large k the interval can miss the exact
    value; its bar on that side is then empty rather than negative, which matplotlib refuses."""
    return [[max(0.0, y - lo) for y, (lo, _) in zip(ys, intervals, strict=True)],
            [max(0.0, hi - y) for y, (_, hi) in zip(ys, intervals, strict=True)]]


def _hack_legend(a: Analysis, which: str) -> str:
    """The legend entry of a reward-hack mark: what the treatment did with the runs."""
    hacks = a.paper.hacks if a.paper else "paper"
    if which == "altered":
        return f"uses a run treated as a reward hack (--hacks {hacks}: its score changed)"
    return f"uses a suspected reward hack kept at its released score (--hacks {hacks})"


def _hack_marks(ax: Axes, a: Analysis, points: list[tuple[float, float, Allocation]],
                env: str | None = None) -> None:
    """Mark the points whose runs include a suspected reward hack (in `env` only, where given)."""
    for which in ("altered", "kept"):
        marked = [(x, y) for x, y, p in points
                  if (envs := p.hacks_altered if which == "altered" else p.hacks_kept)
                  and (env is None or env in envs)]
        if marked:
            ax.plot([x for x, _ in marked], [y for _, y in marked], ls="none", zorder=6,
                    label=_hack_legend(a, which), **HACK_MARKS[which])  # type: ignore[arg-type]


def _errorbar(ax: Axes, look: _Look, g: GroupSummary, points: list[Allocation],
              x_of: Callable[[Allocation], float], label: str | None, a: Analysis | None = None) -> None:
    """One group's curve: dodged points with interval bars, hollow where a split covers only some
    environments."""
    if not points:
        return
    runs: list[list[Allocation]] = []
    for p in points:  # a line joins only splits over the same environments
        if runs and runs[-1][-1].environments == p.environments:
            runs[-1].append(p)
        else:
            runs.append([p])
    if len(runs) > 1:
        for i, part in enumerate(runs):
            _errorbar(ax, look, g, part, x_of, label if i == 0 else None, a)
        return
    xs = [look.dodge(g.group, x_of(p)) for p in points]
    ys = [p.estimate.exact for p in points]
    err = _bars(ys, [(p.estimate.ci_low, p.estimate.ci_high) for p in points])
    color = look.color[g.group]
    partial = points[0].partial
    ax.errorbar(xs, ys, yerr=err, color=color, ls=look.style[g.group], lw=2.4 if g.is_human else 1.5,
                marker=look.marker[g.group], ms=6 if g.is_human else 5, capsize=2.5, elinewidth=1, alpha=0.95,
                label=label, zorder=4 if g.is_human else 3, mfc="white" if partial else color)
    if a is not None:
        _hack_marks(ax, a, list(zip(xs, ys, points, strict=True)))


def _partial_curves(a: Analysis, group: str) -> dict[tuple[str, ...], list[Allocation]]:
    """With --coverage covered: the group's best split per budget over the largest set of fewer
    environments it has runs in (smaller sets stay in the tables: a line each would crowd the figure)."""
    found: dict[tuple[str, ...], dict[float, Allocation]] = {}
    for p in a.allocations:
        if p.group == group and p.partial:
            by_budget = found.setdefault(tuple(p.environments), {})
            if p.budget_h not in by_budget or p.estimate.exact > by_budget[p.budget_h].estimate.exact:
                by_budget[p.budget_h] = p
    if not found:
        return {}
    envs = max(found, key=lambda e: (len(e), len(found[e])))
    return {envs: sorted(found[envs].values(), key=lambda p: p.budget_h)}


def _panel_title(a: Analysis, cohort: str, title: str) -> str:
    """A panel's title, with the mark of a cohort kept apart from the paper's humans on its own line."""
    apart = a.apart(cohort)
    return title if apart is None else f"{title}\n{apart.replace(' (', chr(10) + '(', 1)}"


def budget_figure(a: Analysis) -> bytes | None:
    """score@k against total budget: the paper's agents and ours beside humans, the release's other models
    apart (the paper's Figure 1 shape), and each cohort not comparable with the paper's humans in a panel
    of its own with its own axis."""
    groups = [g for g in a.groups if a.curve(g.group)]
    if not groups:
        return None
    look = _Look(a)
    cohorts = [c for c in a.cohorts() if any(g.cohort == c for g in groups)]
    first = [g for g in groups if g.cohort == cohorts[0]]
    main = [g for g in first if g.kind in ("human", "ours", "paper agent")]
    others = [g for g in first if g.kind == "release model"]
    title = ("The paper's agents" + (" and ours" if any(g.kind == "ours" for g in main) else "")
             if any(g.kind == "paper agent" for g in main) else "Agents")
    panels = [(_panel_title(a, cohorts[0], title), main, True)] if main else []
    if others:
        humans = [g for g in first if g.is_human]
        panels.append(("Other models in the paper's release", humans + others, True))
    for cohort in cohorts[1:]:
        panels.append((_panel_title(a, cohort, "Ours"), [g for g in groups if g.cohort == cohort], False))
    # Three panels get a shorter label: the long ones run into each other.
    xlabel = ("total time budget per environment (k runs × run length)" if len(panels) < 3
              else "total budget (k runs × run length)")
    with _rc():
        fig = Figure(figsize=(WIDTH_IN, 5.6), layout="constrained")
        grid = fig.add_gridspec(1, len(panels))
        axes: list[Axes] = []
        for i, (_, _, shared) in enumerate(panels):
            axes.append(fig.add_subplot(grid[0, i], sharey=axes[0] if shared and axes else None))
        for ax, (title, members, shared) in zip(axes, panels, strict=True):
            shown: set[tuple[str, ...]] = set()
            for g in members:
                full = [p for p in a.curve(g.group) if not p.partial]
                _errorbar(ax, look, g, full, lambda p: p.budget_h, look.label[g.group], a)
                for envs, pts in _partial_curves(a, g.group).items():
                    _errorbar(ax, look, g, pts, lambda p: p.budget_h,
                              f"{look.label[g.group]} over its {len(envs)} envs (hollow)", a)
                    shown.update({envs} if not g.is_human else set())
            for envs in sorted(shown):
                for h in (h for h in members if h.is_human):  # only humans of the panel's own cohort
                    pts = [p for p in a.partial_humans
                           if p.group == h.group and tuple(p.environments) == envs]
                    _errorbar(ax, look, h, pts, lambda p: p.budget_h,
                              f"{look.label[h.group]} over the same {len(envs)} envs (hollow)")
            _hours_axis(ax, a.settings.budgets_h, xlabel)
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.set_title(title)
            if ax is axes[0]:
                ax.set_ylabel("score@k (mean normalised score over environments)")
            elif not shared:
                ax.set_ylabel("score@k, on its own scale")
            else:
                ax.tick_params(labelleft=False)
            _style(ax)
        for ax in axes:  # after every panel is drawn: a shared axis then scales to all of their data
            ax.set_ylim(bottom=0)
        fig.suptitle(f"Best of k runs against total time budget ({len(a.settings.environments)} "
                     f"environment(s), {a.settings.level:.0%} CI)")
        _legend(fig, axes, ncols=2, order=[look.label[g.group] for g in a.groups])
        return _png(fig)


def k_figure(a: Analysis) -> bytes | None:
    """score@k against k for each run length (the paper's Figure 4 style): how a fixed run length gains
    from more runs."""
    lines: dict[float, list[tuple[GroupSummary, list[Allocation]]]] = {}
    keep, _ = _first_cohort(a)
    for g in (g for g in a.groups if g.group in keep):
        by_length: dict[float, list[Allocation]] = {}
        for al in a.allocations:
            if al.group == g.group and al.method == "best_of_k" and not al.partial:
                by_length.setdefault(al.length_h, []).append(al)
        for length, pts in by_length.items():
            lines.setdefault(length, []).append((g, sorted(pts, key=lambda p: p.k)))
    if not lines:
        return None
    look = _Look(a)
    lengths = sorted(lines)
    with _rc():
        fig = Figure(figsize=(WIDTH_IN, 4.9), layout="constrained")
        axes = list(fig.subplots(1, len(lengths), squeeze=False, sharey=True)[0])
        for ax, length in zip(axes, lengths, strict=True):
            ks = sorted({p.k for _, pts in lines[length] for p in pts})
            for g, pts in lines[length]:
                _errorbar(ax, look, g, pts, lambda p: p.k, look.label[g.group], a)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(ks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            ax.set_xlabel(f"k (runs of {fmt_hours(length)})")
            ax.set_title(f"{fmt_hours(length)} runs")
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            _style(ax)
        for ax in axes:  # after every panel is drawn: a shared axis then scales to all of their data
            ax.set_ylim(bottom=0)
        axes[0].set_ylabel("score@k")
        fig.suptitle(f"score@k against the number of runs k, per run length ({a.settings.level:.0%} CI)")
        _legend(fig, axes, ncols=2, order=[look.label[g.group] for g in a.groups])
        return _png(fig)


def per_env_figure(a: Analysis) -> bytes | None:
    """The budget curves for each environment on its own, with intervals: which environments carry the
    average."""
    look = _Look(a)
    envs = a.settings.environments
    keep, _ = _first_cohort(a)
    groups = [g for g in a.groups if a.curve(g.group) and g.kind != "release model" and g.group in keep]
    if not groups:
        return None
    ncols = min(3, len(envs))
    nrows = math.ceil(len(envs) / ncols)
    with _rc():
        fig = Figure(figsize=(WIDTH_IN, 3.5 * nrows + 1.2), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, env in enumerate(envs):
            ax = axes[i // ncols][i % ncols]
            for g in groups:
                curve = [p for p in a.curve(g.group) if env in p.estimate.per_env]
                if not curve:
                    continue
                xs = [look.dodge(g.group, p.budget_h) for p in curve]
                ys = [p.estimate.per_env[env] for p in curve]
                ci = [p.estimate.per_env_ci.get(env, (y, y)) for p, y in zip(curve, ys, strict=True)]
                ax.errorbar(xs, ys, yerr=_bars(ys, ci),
                            color=look.color[g.group], ls=look.style[g.group], lw=2.2 if g.is_human else 1.3,
                            marker=look.marker[g.group], ms=4, capsize=2, elinewidth=0.9,
                            label=look.label[g.group])
                _hack_marks(ax, a, list(zip(xs, ys, curve, strict=True)), env)
            ax.set_title(env)
            budgets = a.settings.budgets_h
            ticks = budgets if len(budgets) <= 5 else budgets[::2]  # every other one: room for the labels
            bottom = i // ncols == nrows - 1 or i + ncols >= len(envs)
            _hours_axis(ax, ticks, "total budget" if bottom else "")
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.set_ylim(bottom=0)
            if i % ncols == 0:
                ax.set_ylabel("score@k")
            _style(ax)
        for j in range(len(envs), nrows * ncols):
            axes[j // ncols][j % ncols].remove()
        fig.suptitle("score@k by environment (each group's best split per budget, "
                     f"{a.settings.level:.0%} CI)")
        spare = None
        if len(envs) < nrows * ncols:  # the legend takes the empty places of the last row
            spare = fig.add_subplot(axes[0][0].get_gridspec()[nrows - 1, len(envs) % ncols:])
        _legend(fig, [ax for row in axes for ax in row][:len(envs)], ncols=2,
                order=[look.label[g.group] for g in a.groups], into=spare)
        return _png(fig)


def over_time_figure(a: Analysis) -> bytes | None:
    """Mean best-so-far score against time within runs (log-linear interpolation between scorings)."""
    if not a.time_curves:
        return None
    look = _Look(a)
    styles = ["-", "--", "-.", ":"]
    lengths = sorted({c.length_h for c in a.time_curves})
    with _rc():
        fig = Figure(figsize=(WIDTH_IN * 0.85, 5.2), layout="constrained")
        ax = fig.add_subplot()
        for c in a.time_curves:
            ls = styles[lengths.index(c.length_h) % len(styles)]
            color = look.color.get(c.group, "grey")
            ax.fill_between(c.hours, c.ci_low, c.ci_high, color=color, alpha=0.12, linewidth=0)
            ax.plot(c.hours, c.mean, ls=ls, lw=2, color=color,
                    label=f"{look.label.get(c.group, c.group)}, {fmt_hours(c.length_h)} runs (n={c.runs})")
        ax.set_xscale("log")
        low, high = min(c.hours[0] for c in a.time_curves), max(c.hours[-1] for c in a.time_curves)
        ax.xaxis.set_major_locator(FixedLocator([x for x in TIME_TICKS_H if low * 0.99 <= x <= high * 1.01]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_hours(x)))
        ax.set_xlabel("time into the run (log scale)")
        ax.set_ylabel("mean best-so-far normalised score")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Score over time within runs ({a.settings.level:.0%} CI)")
        _style(ax)
        _legend(fig, [ax], ncols=1)
        return _png(fig)


def cost_figure(a: Analysis) -> bytes | None:
    """score@k against what the k runs cost: dollars (or tokens) and GPU-hours, where the data has them."""
    look = _Look(a)
    panels: list[tuple[str, Callable[[object], float | None]]] = []
    if any(c.dollars for c in a.cost):
        panels.append(("agent's model cost per environment (US$)", lambda c: c.dollars))  # type: ignore[attr-defined]
    elif any(c.tokens for c in a.cost):
        panels.append(("agent's model tokens per environment", lambda c: c.tokens))  # type: ignore[attr-defined]
    if any(c.gpu_hours for c in a.cost):
        panels.append(("GPU-hours per environment", lambda c: c.gpu_hours))  # type: ignore[attr-defined]
    if not panels:
        return None
    with _rc():
        fig = Figure(figsize=(min(WIDTH_IN, 5.2 * len(panels) + 1), 4.8), layout="constrained")
        axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
        groups = sorted({c.group for c in a.cost}, key=lambda g: [x.group for x in a.groups].index(g))
        for ax, (label, get) in zip(axes, panels, strict=True):
            for g in groups:
                pts = [(get(c), c) for c in a.cost if c.group == g]
                pts = [(x, c) for x, c in pts if x]
                if not pts:
                    continue
                xs = [x for x, _ in pts]
                ys = [c.score for _, c in pts]
                err = _bars(ys, [(c.ci_low, c.ci_high) for _, c in pts])
                ax.errorbar(xs, ys, yerr=err, marker=look.marker[g], ms=5, capsize=2, lw=1.4,
                            color=look.color[g], label=look.label[g])
            ax.set_xscale("log")
            ax.set_xlabel(label + " (log scale)")
            ax.set_ylabel("score@k")
            ax.set_ylim(bottom=0)
            _style(ax)
        fig.suptitle("Score against cost (one point per total time budget)")
        _legend(fig, axes, ncols=2)
        return _png(fig)


def percentile_figure(a: Analysis) -> bytes | None:
    """How often an agent's best-of-k beats a human attempt, as the budget grows."""
    comps = [c for c in a.comparisons if c.percentile is not None]
    if not comps:
        return None
    look = _Look(a)
    with _rc():
        fig = Figure(figsize=(WIDTH_IN * 0.85, 4.9), layout="constrained")
        ax = fig.add_subplot()
        order = [g.group for g in a.groups]
        pairs = sorted({(c.agent, c.human) for c in comps}, key=lambda p: order.index(p[0]))
        several_humans = len({h for _, h in pairs}) > 1
        for agent, human in pairs:
            pts = sorted((c.budget_h, c.percentile) for c in comps if c.agent == agent and c.human == human)
            xs = [look.dodge(agent, p[0], 0.1) for p in pts]
            ax.plot(xs, [p[1] for p in pts],
                    marker=look.marker[agent], ms=5, lw=1.6, ls=look.style[agent], color=look.color[agent],
                    label=f"{look.label[agent]} vs {human}" if several_humans else look.label[agent])
            _hack_marks(ax, a, [(x, y, alloc) for x, (b, y) in zip(xs, pts, strict=True)
                                if (alloc := a.best_at(agent, b)) is not None])
        ax.axhline(50, color="grey", lw=0.8, ls=":")
        _hours_axis(ax, a.settings.budgets_h, "agent's total time budget per environment")
        ax.set_ylabel("chance of beating a human attempt (%)")
        ax.set_ylim(0, 100)
        ax.set_title("Agents' best of k against single human expert attempts")
        _style(ax)
        _legend(fig, [ax], ncols=2)
        return _png(fig)


FIGURES: dict[str, tuple[str, Callable[[Analysis], bytes | None], Callable[[Analysis], str]]] = {
    "budget": ("score@k against total time budget", budget_figure, budget_caption),
    "k": ("score@k against the number of runs", k_figure, k_caption),
    "per_env": ("Per-environment results", per_env_figure, per_env_caption),
    "percentile": ("Agents against human attempts", percentile_figure, percentile_caption),
    "over_time": ("Score over time", over_time_figure, over_time_caption),
    "cost": ("Score against cost", cost_figure, cost_caption),
}
