"""One self-contained HTML page: figures as inline base64 PNG, the tables, methods, caveats, sources."""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from pathlib import Path

from openrebench.api import OpenRebenchError

from ._estimators import SE_FLOOR
from ._figures import FIGURES
from ._results import Analysis
from ._tables import TableSpec, all_tables, treatment_tables

MISSING = {
    "budget": "No group has runs in every environment of the analysis, so there is no score@k curve.",
    "k": "No score@k curves to draw against k.",
    "per_env": "No score@k curves to break down.",
    "percentile": "No human attempts in the data to compare agents with (add --paper, whose humans meet "
                  "full-tier runs only, or logs of the human agent at the agents' tier).",
    "over_time": "No score logs in the data (the paper's release has final scores only).",
    "cost": "No token, dollar or GPU-hour data (the paper's release has none; mini-tier runs use no GPU).",
}

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1a1a1a;max-width:1180px;
  margin:2em auto;padding:0 1.2em}
h1{font-size:1.7em;margin-bottom:.2em}
h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
figure{margin:1.2em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.92em}
table{border-collapse:collapse;margin:.6em 0 1.6em;font-size:.88em}
th,td{border:1px solid #ddd;padding:.3em .55em;vertical-align:top}
th{background:#f4f4f4;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:pre-line}
caption{caption-side:bottom;text-align:left;color:#555;padding-top:.3em;font-size:.92em}
table.headline td:nth-child(-n+3){min-width:10em}
table.claims td:nth-child(-n+4){min-width:8em}
figure h3{margin-bottom:.4em}
.meta{color:#555}.warn{color:#8a4b00}.missing{color:#777;font-style:italic}.scroll{overflow-x:auto}
"""

METHODS = """
<ul>
<li><b>score@k</b>: for each environment, the expected best of k runs drawn with replacement from a
group's runs of one length, averaged over environments. For environments whose score the agent cannot
see ({hidden}), a random one of the k counts instead of the best. The paper estimates this by
sampling; we report the exact value from order statistics,
E[max] = Σ x<sub>(i)</sub>[(i/n)<sup>k</sup> − ((i−1)/n)<sup>k</sup>],
and also the sampling estimate, and list where they part.</li>
<li><b>Intervals</b>: percentile bootstrap; each environment's runs are resampled independently and
score@k recomputed exactly.</li>
<li><b>Time budgets</b>: a total budget T is spent as k runs of length L with k·L = T; each group gets
its best split at each T. Humans make 8-hour attempts (k = T/8); below 8 hours they count the score
their attempts had reached by then, which needs score logs.</li>
<li><b>Coverage</b>: score@k averages over every environment of the analysis, so a run length without
runs in all of them is left out (listed); with <code>--coverage covered</code> it is averaged over the
environments it covers, marked, and compared with the humans on those environments only.</li>
<li><b>Normalisation</b>: 0 = starting solution, 1 = reference. Our runs carry two scores: measured (our
start and reference, measured on our hardware) and paper-matched (the improvement over our measured
start in units of the paper's start-to-reference gap). Where our runs meet the paper's humans, the
paper-matched one is used unless <code>--normalisation measured</code> is given.</li>
<li><b>The paper's data</b>: reward hacks, human attempts and rows are read as the data-treatment tables
say (<code>--hacks</code>, <code>--human-hours</code>, <code>--human-rows</code>).</li>
<li><b>Score over time</b>: each run's best-so-far score (the last so far where a run's last valid
scoring counts), interpolated linearly in log time between
scorings, averaged over runs and then over environments.</li>
<li><b>Against humans</b>: agent/human ratio of score@k at the same budget, and the chance that an
agent's best of k beats a random human attempt in the same environment (ties count half), averaged
over environments.</li>
<li><b>Who is compared with whom</b>: the paper's humans worked on the paper's full-size tasks, on the
paper's scale, so only the paper's agents and our full-tier runs on the paper-matched scale are set
against them. Our runs of another tier (mini), or on the measured scale, form cohorts of their own:
their own tables and figure panel, marked "not comparable with the paper's humans", compared only
with humans of the same cohort (a person's own runs with the human agent).</li>
<li><b>Standard-error floor</b>: the z between the sampling and the exact estimate divides by the
sampling standard error floored at {se_floor} normalised units (the estimator table's last digit): runs with
(near-)identical scores have an SE of round-off alone. Where the floor was used, the notes and the
estimator table say so; a ratio over a human score below it is not given.</li>
</ul>
"""


def _table_html(t: TableSpec) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows:
        cells = "".join(f'<td class="n">{html.escape(v)}</td>' if i in t.numeric
                        else f"<td>{html.escape(v)}</td>" for i, v in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    caption = f"<caption>{html.escape(t.caption)}</caption>" if t.caption else ""
    return (f'<h3 id="table-{t.key}">{html.escape(t.title)}</h3><div class="scroll"><table class="{t.key}">'
            f"{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def render_report(a: Analysis, title: str = "openrebench analysis") -> str:
    """The whole page as a string."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             "<meta name='viewport' content='width=device-width,initial-scale=1'>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='meta'>Generated {datetime.now(UTC):%Y-%m-%d %H:%M UTC} · environments: "
             f"{html.escape(', '.join(a.settings.environments))} · bootstrap {a.settings.boots}, sampling "
             f"{a.settings.sims} draws, seed {a.settings.seed}</p>"]
    tables = {t.key: t for t in all_tables(a, full=True)}
    if "claims" in tables:
        parts.append("<h2>This reproduction against the paper</h2>" + _table_html(tables.pop("claims")))
    if "headline" in tables:
        parts.append("<h2>Headline: agents against human experts</h2>" + _table_html(tables.pop("headline")))
    treatment = [t.key for t in treatment_tables(a)]
    if treatment:
        parts.append("<h2>How the data was read</h2>" + "".join(_table_html(tables.pop(k)) for k in treatment
                                                                  if k in tables))
    parts.append("<h2>Figures</h2>")
    for key, (title, make, caption) in FIGURES.items():
        png = make(a)
        if png is None:
            parts.append(f"<h3>{html.escape(title)}</h3><p class='missing'>{html.escape(MISSING[key])}</p>")
            continue
        data = base64.b64encode(png).decode()
        parts.append(f"<figure id='fig-{key}'><h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{data}'><figcaption>{html.escape(caption(a))}</figcaption>"
                     "</figure>")
    parts.append("<h2>Tables</h2>" + "".join(_table_html(t) for t in tables.values()))
    hidden = ", ".join(a.settings.hidden_score) or "none in this analysis"
    parts.append("<h2>Methods</h2>" + METHODS.replace("{hidden}", html.escape(hidden))
                 .replace("{se_floor}", f"{SE_FLOOR:g}"))
    if a.warnings or a.notes:
        parts.append("<h2>Warnings and caveats</h2><ul>"
                     + "".join(f"<li class='warn'>{html.escape(w)}</li>" for w in a.warnings)
                     + "".join(f"<li>{html.escape(n)}</li>" for n in a.notes) + "</ul>")
    parts.append("<h2>Sources</h2><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in a.sources) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(a: Analysis, out: Path, title: str = "openrebench analysis") -> Path:
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_report(a, title), encoding="utf-8")
    except OSError as e:
        raise OpenRebenchError(f"cannot write {out}: {e.strerror}") from None
    return out
