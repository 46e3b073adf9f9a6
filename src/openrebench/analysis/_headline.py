"""The paper's headline comparisons, recomputed from its public data and set beside the published ones."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._analysis import Allocation, Analysis, HeadlineRow, _Engine, _run
from ._budget import fmt_hours
from ._model import Attempt, Dataset
from ._paper import HUMAN_GROUP, PAPER_MAIN_AGENTS, PUBLISHED, load_paper

HACK_FACTOR = 1.5


def _best_agent(analysis: Analysis, budget: float, among: Sequence[str] | None = None) -> Allocation | None:
    candidates = [a for g in analysis.groups if not g.is_human and (among is None or g.group in among)
                  if (a := analysis.best_at(g.group, budget)) is not None]
    return max(candidates, key=lambda a: a.estimate.exact, default=None)


def _fmt_ratio(value: float, ci: tuple[float, float] | None) -> str:
    return f"{value:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _describe(a: Allocation | None) -> str:
    if a is None:
        return "none"
    e = a.estimate
    return f"{a.group} ({a.label}) {e.exact:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}]"


def _row(key: str, reproduced: str, value: float | None, ci: tuple[float, float] | None = None,
         note: str = "", label: str | None = None, suffix: str = "") -> HeadlineRow:
    p = PUBLISHED.get(key)
    label = (label or (p.label if p else key)) + (f" ({suffix.replace('_', ' ')})" if suffix else "")
    return HeadlineRow(key=key + (f"_{suffix}" if suffix else ""), label=label,
                       reproduced=reproduced, value=value, ci=ci,
                       published=p.text if p else "—", published_value=p.value if p else None,
                       citation=p.citation if p else "", note=note)


def _ratio_rows(analysis: Analysis, engine: _Engine, suffix: str = "", extra: str = "",
                extra_rest: str = "") -> list[HeadlineRow]:
    """The three budget comparisons: 2 h (a bound only), 8 h and 32 h."""
    rows: list[HeadlineRow] = []
    h8 = analysis.best_at(HUMAN_GROUP, 8.0)
    h32 = analysis.best_at(HUMAN_GROUP, 32.0)
    best = {t: _best_agent(analysis, t) for t in (2.0, 8.0, 32.0)}
    main = {t: _best_agent(analysis, t, PAPER_MAIN_AGENTS) for t in (2.0, 8.0, 32.0)}
    if h8 is None or h32 is None or any(v is None for v in best.values()):
        return rows
    assert best[2.0] and best[8.0] and best[32.0]
    a2, a8, a32 = best[2.0], best[8.0], best[32.0]

    bound = a2.estimate.exact / h8.estimate.exact
    ci = engine.ratio_ci((a2.group, 2.0), (HUMAN_GROUP, 8.0))
    rows.append(_row("ratio_2h", f"≥ {_fmt_ratio(bound, ci)} (lower bound)", bound, ci, suffix=suffix, note=(
        extra + "The release has no human score logs, so humans' 2-hour score (the paper read it from its "
        "8-hour attempts' score logs) cannot be recomputed; their 8-hour score bounds it from above, so this "
        f"ratio bounds the published one from below. Best agent at 2 h: {_describe(a2)}; of the paper's two "
        f"main agents: {_describe(main[2.0])}; humans at 8 h: {h8.estimate.exact:.3f}.")))
    r8 = a8.estimate.exact / h8.estimate.exact
    ci = engine.ratio_ci((a8.group, 8.0), (HUMAN_GROUP, 8.0))
    rows.append(_row("ratio_8h", _fmt_ratio(r8, ci), r8, ci, suffix=suffix, note=(
        extra_rest + f"Best agent at 8 h: {_describe(a8)}; of the paper's main agents: "
        f"{_describe(main[8.0])}; "
        f"humans (one 8-hour attempt): {_describe(h8)}.")))
    r32 = h32.estimate.exact / a32.estimate.exact
    ci = engine.ratio_ci((HUMAN_GROUP, 32.0), (a32.group, 32.0))
    rows.append(_row("ratio_32h_humans", _fmt_ratio(r32, ci), r32, ci, suffix=suffix, note=(
        extra_rest + f"Humans (best of 4 attempts): {_describe(h32)}; best agent at 32 h: "
        f"{_describe(a32)}; of the "
        f"paper's main agents: {_describe(main[32.0])}.")))
    return rows


def headline_rows(analysis: Analysis, engine: _Engine) -> list[HeadlineRow]:
    """Published claims against our numbers; where the data cannot give a number, say why."""
    rows = _ratio_rows(analysis, engine)
    if not rows:
        return rows
    for t in (2.0, 8.0, 32.0):
        a = _best_agent(analysis, t)
        assert a is not None
        pct = engine.percentile(a.group, a, HUMAN_GROUP)
        if pct is not None:
            rows.append(_row(f"percentile_{t:g}h", f"{pct:.0f}%", pct, label=(
                f"best agent at {fmt_hours(t)}: chance of beating a human 8-hour attempt"),
                note=f"{a.group}, {a.label}; averaged over environments (no published number)."))

    real = [x.score for x in engine.by_group[HUMAN_GROUP]]
    likely = [x.score for x in load_paper("likely71").attempts if x.is_human]
    both = {"real": np.array(real), "likely": np.array(likely)}

    def stat(key: str, fn, fmt: str) -> None:  # type: ignore[no-untyped-def]
        value = float(fn(both["real"]))
        text = (f"{fmt.format(value)} ({len(real)} real rows); {fmt.format(fn(both['likely']))} "
                f"({len(likely)} rows likely among the 71)")
        rows.append(_row(key, text, value,
                         note="Final scores; a few attempts ran past 8 h, which the paper scored at 8 h."))

    rows.append(_row("human_n", f"{len(real)} real rows ({len(likely)} likely among the paper's 71)",
                     float(len(real)), note="The release does not mark which attempts the paper used."))
    stat("human_mean", np.mean, "{:.2f}")
    stat("human_nonzero", lambda v: np.mean(v > 0), "{:.0%}")
    stat("human_ge_ref", lambda v: np.mean(v >= 1), "{:.0%}")
    return rows


def suspected_hacks(data: Dataset, factor: float = HACK_FACTOR) -> list[Attempt]:
    """Agent runs scoring above `factor` times the best human attempt in their environment.

    The paper zeroed runs it judged to be cheating after manual review (e.g. skipping the training the
    task asks for); the release keeps their scores. This rule is our stand-in, used only as a
    sensitivity check, never for the main numbers.
    """
    best: dict[str, float] = {}
    for a in data.attempts:
        if a.is_human:
            best[a.env_id] = max(best.get(a.env_id, 0.0), a.score)
    return [a for a in data.attempts
            if not a.is_human and a.env_id in best and a.score > factor * best[a.env_id]]


def _without_hacks(data: Dataset, boots: int, sims: int, seed: int, level: float) -> list[HeadlineRow]:
    flagged = suspected_hacks(data)
    if not flagged:
        return []
    ids = {id(a) for a in flagged}
    cleaned = data.model_copy(update={"attempts": [a.model_copy(update={"score": 0.0}) if id(a) in ids else a
                                                   for a in data.attempts]})
    analysis, engine = _run(cleaned, None, None, 32.0, boots, sims, seed, level)
    runs = "; ".join(f"{a.group} on {a.env_id}, {a.score:.2f} ({a.source})" for a in flagged)
    extra = (f"Sensitivity check: {len(flagged)} agent run(s) scoring above {HACK_FACTOR:g}× the best human "
             f"attempt in their environment set to 0, as the paper did for runs it judged cheating: {runs}. ")
    return _ratio_rows(analysis, engine, suffix="suspected_hacks_zeroed", extra=extra,
                       extra_rest="Suspected reward hacks set to 0 (listed in the 2-hour row). ")


def _with_sensitivity(rows: list[HeadlineRow], sensitivity: list[HeadlineRow]) -> list[HeadlineRow]:
    n = sum(r.key.startswith("ratio_") for r in rows)
    return rows[:n] + sensitivity + rows[n:]


def paper_headline(*, boots: int = 1000, sims: int = 2000, seed: int = 0,
                   level: float = 0.95) -> list[HeadlineRow]:
    """The headline comparison on the paper's data alone (all seven environments)."""
    data = load_paper("real")
    analysis, engine = _run(data, None, None, 32.0, boots, sims, seed, level)
    return _with_sensitivity(headline_rows(analysis, engine), _without_hacks(data, boots, sims, seed, level))


def analyze_paper(*, boots: int = 1000, sims: int = 2000, seed: int = 0, level: float = 0.95) -> Analysis:
    """The full analysis of the paper's data, with the headline rows attached."""
    data = load_paper("real")
    analysis, engine = _run(data, None, None, 32.0, boots, sims, seed, level)
    analysis.headline = _with_sensitivity(headline_rows(analysis, engine),
                                          _without_hacks(data, boots, sims, seed, level))
    return analysis
