"""Paper-style figures (matplotlib, Agg, no pyplot state): each returns PNG bytes, or None without data."""

from __future__ import annotations

import io
import math
from collections.abc import Callable

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ._analysis import Analysis
from ._budget import fmt_hours

HUMAN_COLOR = "black"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f"]
MARKERS = ["o", "s", "D", "^", "v", "P"]
DPI = 110
TIME_TICKS_H = [1 / 60, 5 / 60, 15 / 60, 0.5, 1, 2, 4, 8, 16, 32, 64]


def _style(ax: Axes) -> None:
    ax.grid(True, which="major", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


def _colors(a: Analysis) -> dict[str, str]:
    agents = [g.group for g in a.groups if not g.is_human]
    out = {g.group: HUMAN_COLOR for g in a.groups if g.is_human}
    out.update({g: PALETTE[i % len(PALETTE)] for i, g in enumerate(agents)})
    return out


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


def _legend(fig: Figure, ax: Axes, n: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right center" if n > 4 else "outside lower center",
                   ncols=1 if n > 4 else n, frameon=False)


def budget_figure(a: Analysis) -> bytes | None:
    """score@k against total budget, one line per group with its interval; the paper's Figure 1 shape."""
    colors = _colors(a)
    curves = [(g, a.curve(g.group)) for g in a.groups]
    curves = [(g, c) for g, c in curves if c]
    if not curves:
        return None
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    lengths = sorted({p.length_h for _, c in curves for p in c})
    markers = {length: MARKERS[i % len(MARKERS)] for i, length in enumerate(lengths)}
    for g, curve in curves:
        x = [p.budget_h for p in curve]
        y = [p.estimate.exact for p in curve]
        lo = [p.estimate.ci_low for p in curve]
        hi = [p.estimate.ci_high for p in curve]
        ax.fill_between(x, lo, hi, color=colors[g.group], alpha=0.12, linewidth=0)
        ax.plot(x, y, lw=2.6 if g.is_human else 1.6, color=colors[g.group], label=g.group,
                zorder=3 if g.is_human else 2)
        for length, marker in markers.items():
            pts = [(p.budget_h, p.estimate.exact) for p in curve if p.length_h == length]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=marker, s=40 if g.is_human else 22,
                           color=colors[g.group], zorder=4)
    if len(markers) > 1:
        for length, marker in markers.items():
            ax.scatter([], [], marker=marker, color="grey", label=f"runs of {fmt_hours(length)}")
    _hours_axis(ax, a.settings.budgets_h, "total time budget per environment (k runs × run length)")
    ax.set_ylabel("score@k (mean normalised score over environments)")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Best of k runs against total time budget ({len(a.settings.environments)} environment(s), "
                 f"{a.settings.level:.0%} CI)")
    _style(ax)
    _legend(fig, ax, len(curves))
    return _png(fig)


def per_env_figure(a: Analysis) -> bytes | None:
    """The same curves for each environment on its own: which environments carry the average."""
    colors = _colors(a)
    envs = a.settings.environments
    groups = [g for g in a.groups if a.curve(g.group)]
    if not groups:
        return None
    ncols = min(4, len(envs))
    nrows = math.ceil(len(envs) / ncols)
    fig = Figure(figsize=(3.4 * ncols + 2.5, 2.9 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, env in enumerate(envs):
        ax = axes[i // ncols][i % ncols]
        for g in groups:
            curve = a.curve(g.group)
            ax.plot([p.budget_h for p in curve], [p.estimate.per_env.get(env, math.nan) for p in curve],
                    marker=".", lw=2.2 if g.is_human else 1.3, color=colors[g.group], label=g.group)
        ax.set_title(env, fontsize=10)
        _hours_axis(ax, a.settings.budgets_h, "total budget" if i // ncols == nrows - 1 else "")
        ax.tick_params(labelsize=7)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_ylim(bottom=0)
        if i % ncols == 0:
            ax.set_ylabel("score@k")
        _style(ax)
    for j in range(len(envs), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle("score@k by environment (best split per budget)")
    _legend(fig, axes[0][0], len(groups) + 5)
    return _png(fig)


def over_time_figure(a: Analysis) -> bytes | None:
    """Mean best-so-far score against time within runs (log-linear interpolation between scorings)."""
    if not a.time_curves:
        return None
    colors = _colors(a)
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    styles = ["-", "--", "-.", ":"]
    lengths = sorted({c.length_h for c in a.time_curves})
    for c in a.time_curves:
        ls = styles[lengths.index(c.length_h) % len(styles)]
        ax.fill_between(c.hours, c.ci_low, c.ci_high, color=colors[c.group], alpha=0.12, linewidth=0)
        ax.plot(c.hours, c.mean, ls=ls, lw=2, color=colors[c.group],
                label=f"{c.group}, {fmt_hours(c.length_h)} runs (n={c.runs})")
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
    _legend(fig, ax, len(a.time_curves))
    return _png(fig)


def cost_figure(a: Analysis) -> bytes | None:
    """score@k against what the k runs cost: dollars (or tokens) and GPU-hours, where the data has them."""
    colors = _colors(a)
    panels: list[tuple[str, Callable[[object], float | None]]] = []
    if any(c.dollars for c in a.cost):
        panels.append(("agent's model cost per environment (US$)", lambda c: c.dollars))  # type: ignore[attr-defined]
    elif any(c.tokens for c in a.cost):
        panels.append(("agent's model tokens per environment", lambda c: c.tokens))  # type: ignore[attr-defined]
    if any(c.gpu_hours for c in a.cost):
        panels.append(("GPU-hours per environment", lambda c: c.gpu_hours))  # type: ignore[attr-defined]
    if not panels:
        return None
    fig = Figure(figsize=(5.2 * len(panels) + 2, 4.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    groups = sorted({c.group for c in a.cost}, key=lambda g: [x.group for x in a.groups].index(g))
    for ax, (label, get) in zip(axes, panels, strict=True):
        for g in groups:
            pts = [(get(c), c) for c in a.cost if c.group == g]
            pts = [(x, c) for x, c in pts if x]
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ys = [c.score for _, c in pts]
            err = [[c.score - c.ci_low for _, c in pts], [c.ci_high - c.score for _, c in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, capsize=2, lw=1.4, color=colors[g], label=g)
        ax.set_xscale("log")
        ax.set_xlabel(label + " (log scale)")
        ax.set_ylabel("score@k")
        ax.set_ylim(bottom=0)
        _style(ax)
    fig.suptitle("Score against cost (one point per total time budget)")
    _legend(fig, axes[0], len(groups))
    return _png(fig)


def percentile_figure(a: Analysis) -> bytes | None:
    """How often an agent's best-of-k beats a human attempt, as the budget grows."""
    comps = [c for c in a.comparisons if c.percentile is not None]
    if not comps:
        return None
    colors = _colors(a)
    fig = Figure(figsize=(9, 4.6), layout="constrained")
    ax = fig.add_subplot()
    pairs = sorted({(c.agent, c.human) for c in comps}, key=lambda p: [g.group for g in a.groups].index(p[0]))
    several_humans = len({h for _, h in pairs}) > 1
    for agent, human in pairs:
        pts = sorted((c.budget_h, c.percentile) for c in comps if c.agent == agent and c.human == human)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", lw=1.6, color=colors[agent],
                label=f"{agent} vs {human}" if several_humans else agent)
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    _hours_axis(ax, a.settings.budgets_h, "agent's total time budget per environment")
    ax.set_ylabel("chance of beating a human attempt (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Agents' best of k against single human expert attempts")
    _style(ax)
    _legend(fig, ax, len(pairs))
    return _png(fig)


FIGURES: dict[str, tuple[str, Callable[[Analysis], bytes | None]]] = {
    "budget": ("score@k against total time budget", budget_figure),
    "per_env": ("Per-environment results", per_env_figure),
    "percentile": ("Agents against human attempts", percentile_figure),
    "over_time": ("Score over time", over_time_figure),
    "cost": ("Score against cost", cost_figure),
}
