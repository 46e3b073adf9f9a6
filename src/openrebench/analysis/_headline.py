"""The paper's headline comparisons, recomputed from its public data and set beside the published ones:
one row per number, a short table of the paper's claims with how ours compare and why they differ, and
the same numbers under the other treatments of the data (reward hacks, human attempts, coverage)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._analyze import _run
from ._budget import fmt_hours
from ._comparisons import human_for
from ._engine import _Engine
from ._paper import (
    HACK_FACTOR,
    HUMAN_GROUP,
    PAPER_HUMAN_HOURS,
    PAPER_MAIN_AGENTS,
    PUBLISHED,
    describe_options,
    load_paper,
    paper_options,
)
from ._results import Allocation, AlternativeRow, Analysis, ClaimRow, Coverage, HeadlineRow

# How close counts as reproduced: the ratio within a quarter of the published one (or its interval
# holding it); the human mean within 0.05; a share within 6 points (one attempt in 17).
RATIO_TOLERANCE = 0.25
MEAN_TOLERANCE = 0.05
SHARE_TOLERANCE = 0.06


def _best_agent(analysis: Analysis, budget: float, among: Sequence[str] | None = None) -> Allocation | None:
    """The best agent split at `budget`: over every environment before one over some."""
    candidates = [a for g in analysis.groups if not g.is_human and (among is None or g.group in among)
                  if (a := analysis.best_at(g.group, budget)) is not None]
    return max(candidates, key=lambda a: (len(a.environments), a.estimate.exact), default=None)


def _fmt_ratio(value: float, ci: tuple[float, float] | None) -> str:
    return f"{value:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _describe(a: Allocation | None) -> str:
    if a is None:
        return "none"
    e = a.estimate
    return f"{a.group} ({a.label}) {e.exact:.3f} [{e.ci_low:.3f}, {e.ci_high:.3f}]"


def _row(key: str, reproduced: str, value: float | None, ci: tuple[float, float] | None = None,
         note: str = "", label: str | None = None) -> HeadlineRow:
    p = PUBLISHED.get(key)
    return HeadlineRow(key=key, label=label or (p.label if p else key), reproduced=reproduced, value=value,
                       ci=ci, published=p.text if p else "—", published_value=p.value if p else None,
                       citation=p.citation if p else "", note=note)


class _Ratios:
    """The three budget comparisons. Each agent's best split is set against the humans on the same
    environments, and the best agent is the one closest to (or furthest above) the humans: with
    `--coverage covered` a split over some environments is compared on those alone."""

    def __init__(self, analysis: Analysis, engine: _Engine) -> None:
        best = {(a.group, a.budget_h): a for a in analysis.allocations if a.best}
        self.agent: dict[float, Allocation | None] = {}
        self.main = {t: _best_agent(analysis, t, PAPER_MAIN_AGENTS) for t in (2.0, 8.0, 32.0)}
        self.human: dict[float, Allocation | None] = {}
        self.value: dict[float, float | None] = {}
        self.ci: dict[float, tuple[float, float] | None] = {}
        for t, human_t in ((2.0, 8.0), (8.0, 8.0), (32.0, 32.0)):
            found = []
            humans = {g.group for g in analysis.groups if g.is_human}
            for a in analysis.allocations:  # every split: under --coverage covered, those over some envs too
                if a.group in humans or a.budget_h != t or not a.estimate.exact:
                    continue
                h, h_reps = human_for(engine, HUMAN_GROUP, human_t, a.environments, best)
                if h is not None and h.estimate.exact:
                    found.append((a.estimate.exact / h.estimate.exact, a, h,
                                  engine.split_replicates.get((a.group, t, a.length_h)), h_reps))
            if not found:
                self.agent[t] = self.human[t] = self.value[t] = self.ci[t] = None
                continue
            ratio, a, h, reps, h_reps = max(found, key=lambda f: (f[0], len(f[1].environments)))
            self.agent[t], self.human[t] = a, h
            self.value[t] = ratio if t < 32 else 1 / ratio
            num_r, den_r = (reps, h_reps) if t < 32 else (h_reps, reps)
            self.ci[t] = (_interval(num_r, den_r, engine.level)
                          if num_r is not None and den_r is not None else None)


def _interval(num: np.ndarray, den: np.ndarray, level: float) -> tuple[float, float]:
    from ._estimators import percentile_interval

    with np.errstate(divide="ignore", invalid="ignore"):
        return percentile_interval(num / den, level)


def _ratio_rows(r: _Ratios) -> list[HeadlineRow]:
    rows: list[HeadlineRow] = []
    if r.value[2.0] is not None:
        rows.append(_row("ratio_2h", f"≥ {_fmt_ratio(r.value[2.0], r.ci[2.0])} (lower bound)", r.value[2.0],
                         r.ci[2.0], note=(
            "The release has no human score logs, so humans' 2-hour score (the paper read it from its "
            "8-hour attempts' score logs) cannot be recomputed; their 8-hour score bounds it from above, so "
            f"this ratio bounds the published one from below. Best agent at 2 h: {_describe(r.agent[2.0])}; "
            f"of the paper's two main agents: {_describe(r.main[2.0])}; humans at 8 h: "
            f"{_describe(r.human[2.0])}.")))
    if r.value[8.0] is not None:
        rows.append(_row("ratio_8h", _fmt_ratio(r.value[8.0], r.ci[8.0]), r.value[8.0], r.ci[8.0], note=(
            f"Best agent at 8 h: {_describe(r.agent[8.0])}; of the paper's main agents: "
            f"{_describe(r.main[8.0])}; humans (one 8-hour attempt): {_describe(r.human[8.0])}.")))
    if r.value[32.0] is not None:
        rows.append(_row("ratio_32h_humans", _fmt_ratio(r.value[32.0], r.ci[32.0]), r.value[32.0],
                         r.ci[32.0], note=(
            f"Humans (best of 4 attempts): {_describe(r.human[32.0])}; best agent at 32 h: "
            f"{_describe(r.agent[32.0])}; of the paper's main agents: {_describe(r.main[32.0])}.")))
    return rows


def _human_scores(engine: _Engine) -> np.ndarray:
    return np.array([a.score for a in engine.by_group[HUMAN_GROUP]])


def headline_rows(analysis: Analysis, engine: _Engine) -> list[HeadlineRow]:
    """Published claims against our numbers; where the data cannot give a number, say why."""
    ratios = _Ratios(analysis, engine)
    rows = _ratio_rows(ratios)
    if not rows:
        return rows
    for t in (2.0, 8.0, 32.0):
        a = ratios.agent[t]
        if a is not None and (pct := engine.percentile(a.group, a, HUMAN_GROUP)) is not None:
            rows.append(_row(f"percentile_{t:g}h", f"{pct:.0f}%", pct, label=(
                f"best agent at {fmt_hours(t)}: chance of beating a human 8-hour attempt"),
                note=f"{a.group}, {a.label}; averaged over environments (no published number)."))
    scores = _human_scores(engine)
    n = len(scores)
    kept = (analysis.paper.humans_text if analysis.paper else f"{n} human attempts")
    rows.append(_row("human_n", f"{n} attempts", float(n), note=kept + " The release does not mark which "
                     "attempts the paper used."))
    for key, value, fmt in (("human_mean", float(scores.mean()), "{:.2f}"),
                            ("human_nonzero", float(np.mean(scores > 0)), "{:.0%}"),
                            ("human_ge_ref", float(np.mean(scores >= 1)), "{:.0%}")):
        rows.append(_row(key, f"{fmt.format(value)} ({n} attempts)", value,
                         note="Final scores of the attempts kept (the paper scored attempts at 8 hours)."))
    return rows


def _by_key(rows: Sequence[HeadlineRow]) -> dict[str, HeadlineRow]:
    return {r.key: r for r in rows}


def _ratio_verdict(value: float, ci: tuple[float, float] | None, published: float) -> str:
    inside = ci is not None and ci[0] <= published <= ci[1]
    if inside or abs(value - published) <= RATIO_TOLERANCE * published:
        return "reproduced"
    return "higher than published" if value > published else "lower than published"


def _gaps(analysis: Analysis) -> str:
    """What the release lacks of the paper's agent runs, in numbers."""
    parts = []
    eight = [g for g in analysis.groups if not g.is_human and 8.0 in g.lengths_h and g.kind != "ours"]
    n8 = sum(r.runs for r in analysis.per_env if r.length_h == 8.0 and not r.group.startswith("Human")
             and r.group in {g.group for g in eight})
    parts.append(f"only {n8} eight-hour agent runs are in the release")
    for d in analysis.dropped:
        if d.group in PAPER_MAIN_AGENTS:
            parts.append(f"{d.group}'s {d.runs} runs of {fmt_hours(d.length_h)} cover {len(d.environments)} "
                         f"of {len(analysis.settings.environments)} environments (left out)")
    parts.append("scaffolds (Modular, AIDE) are not recorded, so each model's runs are pooled")
    return "; ".join(parts)


def _alt(alternatives: Sequence[AlternativeRow] | None, flags: str) -> AlternativeRow | None:
    return next((r for r in alternatives or [] if r.flags == flags), None)


def claim_rows(analysis: Analysis, alternatives: Sequence[AlternativeRow] | None) -> list[ClaimRow]:
    """The paper's headline claims: what it says, what we get under this treatment, and why they part."""
    head = _by_key(analysis.headline or [])
    out: list[ClaimRow] = []
    treatment = analysis.paper
    hacks = treatment.hacks if treatment else "paper"
    altered = "; ".join(f"{r.group} {r.env_id} {r.released:.2f} → {r.used:.2f}"
                        for r in (treatment.altered if treatment else [])) or "none"
    keep = _alt(alternatives, "--hacks keep")
    if (r := head.get("ratio_2h")) is not None and r.value is not None:
        out.append(ClaimRow(
            key="ratio_2h", claim="Agents ≈4× humans at a 2-hour budget", paper="≈4×", ours=r.reproduced,
            verdict="not testable (bound only); consistent" if r.value <= 4.0 else "bound above the claim",
            why="The release has final scores only: humans' 2-hour score (read from their attempts' score "
                "logs in the paper) is unknown, so we divide by their 8-hour score, which is larger: a lower "
                "bound."))
    if (r := head.get("ratio_8h")) is not None and r.value is not None:
        ci = r.ci
        if r.value >= 1 and (ci is None or ci[0] >= 1):
            verdict = "not reproduced: agents ahead"
        elif ci is not None and ci[1] >= 1:
            verdict = "humans ahead, not significantly"
        elif r.value >= 0.8:
            verdict = "reproduced (humans narrowly ahead)"
        else:
            verdict = "humans ahead, by more than narrowly"
        why = f"The release is not the paper's agent set: {_gaps(analysis)}."
        if keep is not None and keep.ratio_8h is not None and hacks != "keep":
            why += (f" Keeping the reward hack ({keep.flags}) gives {keep.ratio_8h:.2f}×: one 30-minute run "
                    "scoring 4.05 carries the best agent's 8-hour score.")
        covered = _alt(alternatives, "--coverage covered")
        if covered is not None and covered.ratio_8h is not None and analysis.settings.coverage != "covered":
            why += (f" Averaged over the environments each split covers ({covered.flags}), the best agent is "
                    f"at {covered.ratio_8h:.2f}× of the humans on the same environments.")
        out.append(ClaimRow(key="ratio_8h", claim="Humans narrowly ahead at 8 hours",
                            paper="< 1 (narrowly)", ours=f"agent / humans {r.reproduced}", verdict=verdict,
                            why=why))
    if (r := head.get("ratio_32h_humans")) is not None and r.value is not None:
        why = ("Humans' best of 4 attempts against the best agent's best split; " + _gaps(analysis) + ".")
        if keep is not None and keep.ratio_32h_humans is not None and hacks != "keep":
            why += f" With the reward hack kept ({keep.flags}): {keep.ratio_32h_humans:.2f}×."
        covered = _alt(alternatives, "--coverage covered")
        if (covered is not None and covered.ratio_32h_humans is not None
                and analysis.settings.coverage != "covered"):
            why += (f" Over the environments each split covers ({covered.flags}): "
                    f"{covered.ratio_32h_humans:.2f}×.")
        out.append(ClaimRow(key="ratio_32h_humans", claim="Humans ≈2× agents at 32 hours", paper="≈2×",
                            ours=f"humans / agent {r.reproduced}",
                            verdict=_ratio_verdict(r.value, r.ci, 2.0), why=why))
    if all(k in head for k in ("human_mean", "human_nonzero", "human_ge_ref")):
        mean, nz, ge = (head[k].value or 0.0 for k in ("human_mean", "human_nonzero", "human_ge_ref"))
        close = (abs(mean - 0.64) <= MEAN_TOLERANCE and abs(nz - 0.82) <= SHARE_TOLERANCE
                 and abs(ge - 0.24) <= SHARE_TOLERANCE)
        n = head["human_n"].value if "human_n" in head else None
        counts = ", ".join(f"{c.env_id} {c.kept}" for c in treatment.human_counts) if treatment else ""
        out.append(ClaimRow(
            key="humans", claim="Human mean score, share > 0, share ≥ reference", paper="0.64, 82%, 24% (71)",
            ours=f"{mean:.2f}, {nz:.0%}, {ge:.0%} ({n:.0f})" if n else f"{mean:.2f}, {nz:.0%}, {ge:.0%}",
            verdict="close" if close else "differs",
            why=(f"Attempts kept per environment: {counts}. The release does not mark the paper's 71 "
                 "attempts, and holds final scores where the paper scored at 8 hours.")))
    if out:
        flags = describe_options(_options_of(analysis))
        if analysis.settings.coverage == "covered":
            flags = (flags + " --coverage covered").strip()
        out.append(ClaimRow(
            key="treatment", claim="Data treatment behind these numbers",
            paper="runs judged cheating scored 0; 8-hour attempts", ours=flags or "the defaults",
            verdict=f"{len(treatment.altered) if treatment else 0} run(s) altered",
            why=f"Reward hacks: {treatment.hacks_text if treatment else hacks}; altered: {altered}."))
    return out


def _options_of(analysis: Analysis) -> dict[str, Any]:
    t = analysis.paper
    if t is None:
        return {}
    return {"hacks": t.hacks, "human_rows": t.human_rows, "human_hours": t.human_hours}


ALTERNATIVES: tuple[tuple[str, dict[str, Any], Coverage], ...] = (
    ("the paper's treatment (default)", {}, "all"),
    ("reward hacks kept as released", {"hacks": "keep"}, "all"),
    (f"suspect runs (> {HACK_FACTOR:g}× best human, or zeroed later) zeroed", {"hacks": "zero"}, "all"),
    ("suspect runs capped at 1", {"hacks": "cap"}, "all"),
    ("human attempts of every length", {"human_hours": None}, "all"),
    ("human rows likely among the paper's 71", {"human_rows": "likely71"}, "all"),
    ("... of every length", {"human_rows": "likely71", "human_hours": None}, "all"),
    ("partial coverage averaged over covered environments", {}, "covered"),
)


def _alternative(name: str, options: dict[str, Any], coverage: Coverage, boots: int, sims: int, seed: int,
                 level: float) -> AlternativeRow:
    data = load_paper(**paper_options(options))
    analysis, engine = _run(data, None, None, 32.0, boots, sims, seed, level, coverage)
    r = _Ratios(analysis, engine)
    scores = _human_scores(engine)
    flags = " ".join(x for x in (describe_options(options), "--coverage covered" if coverage == "covered"
                                 else "") if x)
    return AlternativeRow(
        name=name, flags=flags, description=(data.paper.hacks_text if data.paper else ""),
        humans=len(scores),
        humans_by_env={c.env_id: c.kept for c in data.paper.human_counts} if data.paper else {},
        ratio_2h=r.value[2.0], ratio_8h=r.value[8.0], ratio_8h_ci=r.ci[8.0], ratio_32h_humans=r.value[32.0],
        ratio_32h_ci=r.ci[32.0], human_mean=float(scores.mean()), human_nonzero=float(np.mean(scores > 0)),
        human_ge_ref=float(np.mean(scores >= 1)), altered=len(data.paper.altered) if data.paper else 0)


def alternative_rows(options: dict[str, Any] | None = None, coverage: Coverage = "all", *, boots: int = 1000,
                     sims: int = 2000, seed: int = 0, level: float = 0.95) -> list[AlternativeRow]:
    """The headline under each listed treatment (and the one asked for, if it is none of them)."""
    chosen = paper_options(options)
    chosen.pop("data_dir")
    rows = []
    found = False
    data_dir = (options or {}).get("data_dir")
    for name, opts, cov in ALTERNATIVES:
        full = paper_options({**opts, "data_dir": data_dir})
        same = {k: v for k, v in full.items() if k != "data_dir"} == chosen and cov == coverage
        found |= same
        rows.append(_alternative(name + (" ← this analysis" if same else ""), full, cov, boots, sims, seed,
                                 level))
    if not found:
        rows.insert(0, _alternative("this analysis", {**chosen, "data_dir": data_dir}, coverage, boots, sims,
                                    seed, level))
    return rows


def paper_headline(options: dict[str, Any] | None = None, coverage: Coverage = "all", *, boots: int = 1000,
                   sims: int = 2000, seed: int = 0, level: float = 0.95,
                   alternatives: bool = True) -> Analysis:
    """The paper's data alone (all seven environments) under `options`, with its headline rows, the
    claims table and (unless `alternatives` is False) the headline under the other treatments."""
    data = load_paper(**paper_options(options))
    analysis, engine = _run(data, None, None, 32.0, boots, sims, seed, level, coverage)
    analysis.headline = headline_rows(analysis, engine)
    if alternatives:
        analysis.alternatives = alternative_rows(options, coverage, boots=boots, sims=sims, seed=seed,
                                                 level=level)
    analysis.claims = claim_rows(analysis, analysis.alternatives)
    return analysis


def analyze_paper(*, boots: int = 1000, sims: int = 2000, seed: int = 0, level: float = 0.95,
                  coverage: Coverage = "all", alternatives: bool = True, **options: Any) -> Analysis:
    """The full analysis of the paper's data (read as `options` say: hacks, human_rows, human_hours,
    data_dir), with the headline rows, the claims and the alternatives attached."""
    return paper_headline(options, coverage, boots=boots, sims=sims, seed=seed, level=level,
                          alternatives=alternatives)


__all__ = ["PAPER_HUMAN_HOURS", "alternative_rows", "analyze_paper", "claim_rows", "headline_rows",
           "paper_headline"]
