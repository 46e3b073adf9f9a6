"""The paper's human attempts and agent runs (packaged copy, or a folder of the same files), read as the
paper treated them unless told otherwise, and the numbers the paper published.

Three choices decide how the release is read; each is an option, and each is said in the output:

- **Reward hacks.** The paper scored runs it judged as cheating 0 after reviewing them (Wijk et al.,
  arXiv 2411.15114). The release keeps their scores. METR's later renormalisation in the same file
  (`norm_score_th_20250128_capped`, which caps every score at 1) sets exactly one run to 0:
  o1-preview's optimize_finetune run mp4-server_204921 (released 4.05); the other run far above every
  human, mp4-server_204851 (1.66), it only caps. `paper` (the default) zeroes the runs the later
  release zeroes, `keep` uses the released scores, `zero` and `cap` zero or cap at 1 every suspect
  (those runs and any run above 1.5× the best human attempt in its environment).
- **Human attempts.** The paper compares agents with 8-hour attempts (scored at 8 hours from their
  score logs). The release holds each attempt's final score only: most lasted 7.05 to 8.98 hours,
  four stopped at 3.98 hours and six went on for 9.7 to 137 hours, so their final score overstates an
  8-hour one. By default only attempts of 7 to 9 hours are kept.
- **Which rows.** `real` rows (actual attempts) or those likely among the paper's 71 (`likely71`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel

from openrebench.api import Direction, OpenRebenchError

from ._environments import registered_facts
from ._model import AlteredRun, Attempt, Dataset, EnvFacts, HumanCount, PaperTreatment

HUMAN_GROUP = "Human experts (paper)"
PAPER_TIER = "paper"
HUMAN_ATTEMPT_HOURS = 8.0
# The two agents of the paper's main comparison (arXiv 2411.15114, section 4); the release also
# holds older models and o1, which the first version of the paper did not evaluate.
PAPER_MAIN_AGENTS: tuple[str, ...] = ("Claude 3.5 Sonnet (New)", "o1-preview")
# Every agent the paper evaluated: its main two, and Claude 3.5 Sonnet (Old) (claude-3-5-sonnet-20240620),
# which the paper ran too (30-minute runs in the release). Figures and tables label these as the paper's
# agents, and the release's other models as the release's.
PAPER_AGENTS: tuple[str, ...] = (*PAPER_MAIN_AGENTS, "Claude 3.5 Sonnet (Old)")

HumanRows = Literal["real", "likely71"]
Hacks = Literal["paper", "keep", "zero", "cap"]
HUMAN_ROWS: tuple[str, ...] = ("real", "likely71")
HACKS: tuple[str, ...] = ("paper", "keep", "zero", "cap")
# Attempts of about 8 hours: the release's lengths fall in three clusters, 3.98 h (4 attempts),
# 7.05-8.98 h (76) and 9.67-136.5 h (6); this window is the middle one.
PAPER_HUMAN_HOURS: tuple[float, float] = (7.0, 9.0)
# A run this many times above the best human attempt in its environment is a suspect: only the two
# o1-preview optimize_finetune runs (4.05 and 1.66 against the humans' best 0.97) are.
HACK_FACTOR = 1.5
CAP = 1.0
LATER_COLUMN = "norm_score_th_20250128_capped"
RELEASE = "METR/eval-analysis-public@3a947ac"
HUMANS_FILE = "human_baselines.csv"
AGENTS_FILE = "agent_runs.csv"
HUMAN_COLUMNS = ("env", "attempt_id", "normalized_score", "hours", "status", "paper71_inferred")
AGENT_COLUMNS = ("env", "run_id", "agent_alias", "time_limit_hours", "normalized_score")
STATUSES = ("real", "readme_only", "suspected_placeholder")
PAPER71 = ("likely", "likely_not", "unknown", "no")

_RELEASE = "the paper's release (not implemented here)"
# The release covers seven RE-Bench environments; everything the analysis needs of those openrebench
# implements comes from their registered classes (all seven are built in). These two came later than
# the others and are kept as facts of the release, so that the paper's data reads the same where an
# install lacks them: our id for each, and that, as in every RE-Bench environment but the scaling-law
# one, the agent sees its score and a run's best valid score counts (both are higher-is-better: a win
# rate and a share of problems solved). A registered environment with the same RE-Bench id replaces
# its entry here: its own attributes win.
RELEASE_ONLY_ENVIRONMENTS: tuple[EnvFacts, ...] = (
    EnvFacts(env_id="chat_rl", rebench_id="ai_rd_nanogpt_chat_rl", score_visible=True,
             direction=Direction.MAX, source=_RELEASE),
    EnvFacts(env_id="rust_codecontests", rebench_id="ai_rd_rust_codecontests_inference", score_visible=True,
             direction=Direction.MAX, source=_RELEASE),
)


class Published(BaseModel):
    """One number the paper published, with where it says so."""

    key: str
    label: str
    value: float | None
    text: str
    citation: str


_ABSTRACT = "Wijk et al., RE-Bench, arXiv 2411.15114, abstract"
# Published numbers. The ratios are the abstract's headline claims; the human aggregates are the
# paper's statistics over its 71 eight-hour attempts (also quoted in the data README).
PUBLISHED: dict[str, Published] = {p.key: p for p in [
    Published(key="ratio_2h", label="best agent / humans at 2 h", value=4.0, text="≈4×",
              citation=f"{_ABSTRACT}: 'the best AI agents achieve a score 4× higher than human experts "
                       "when both are given a total time budget of 2 hours per environment'"),
    Published(key="ratio_8h", label="best agent / humans at 8 h", value=None,
              text="< 1 (humans narrowly ahead)",
              citation=f"{_ABSTRACT}: humans 'narrowly exceeding the top AI agent scores given an 8-hour "
                       "budget'"),
    Published(key="ratio_32h_humans", label="humans / best agent at 32 h", value=2.0, text="≈2×",
              citation=f"{_ABSTRACT}: humans 'achieving 2× the score of the top AI agent when both are "
                       "given 32 total hours'"),
    Published(key="human_n", label="human 8-hour attempts", value=71, text="71 (61 experts)",
              citation=f"{_ABSTRACT}: 'data from 71 8-hour attempts by 61 distinct human experts'"),
    Published(key="human_mean", label="human mean normalised score", value=0.64, text="0.64",
              citation="paper's human statistics over its 71 attempts, as quoted in the data README"),
    Published(key="human_nonzero", label="human attempts scoring > 0", value=0.82, text="82%",
              citation=f"{_ABSTRACT}: '82% of expert attempts achieving a non-zero score'"),
    Published(key="human_ge_ref", label="human attempts ≥ reference", value=0.24, text="24%",
              citation=f"{_ABSTRACT}: '24% matching or exceeding our strong reference solutions'"),
]}


def packaged_file(name: str) -> Traversable:
    """The packaged copy of one of the release's files."""
    return resources.files("openrebench.analysis").joinpath("data", "rebench_paper", name)


def _open(name: str, data_dir: Path | None) -> IO[str]:
    if data_dir is None:
        return packaged_file(name).open("r", encoding="utf-8", newline="")
    return (Path(data_dir) / name).open("r", encoding="utf-8", newline="")


def _read_csv(name: str, columns: Sequence[str], data_dir: Path | None = None) -> list[dict[str, str]]:
    """The file's rows, or one line saying why it cannot be used (missing, empty, without a column)."""
    where = name if data_dir is None else str(Path(data_dir) / name)
    try:
        with _open(name, data_dir) as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames
            rows = list(reader)
    except FileNotFoundError:
        if data_dir is None:
            raise OpenRebenchError(f"the packaged paper data is missing ({name}); reinstall "
                                   "openrebench") from None
        raise OpenRebenchError(f"{where} does not exist (--paper-data needs {HUMANS_FILE} and "
                               f"{AGENTS_FILE})") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise OpenRebenchError(f"{where} cannot be read ({type(e).__name__}: {e})") from None
    if not header:
        raise OpenRebenchError(f"{where} is empty (no header row)")
    missing = [c for c in columns if c not in header]
    if missing:
        raise OpenRebenchError(f"{where} lacks column(s) {', '.join(missing)} (it has: "
                               f"{', '.join(header)})")
    if not rows:
        raise OpenRebenchError(f"{where} has a header but no rows")
    return rows


def _number(row: dict[str, str], column: str, where: str, *, empty: float | None = None,
            positive: bool = False) -> float:
    """A finite number from the row (`empty` where the cell may be blank), else a one-line error."""
    text = (row.get(column) or "").strip()
    if not text:
        if empty is not None:
            return empty
        raise OpenRebenchError(f"{where}: {column} is empty")
    try:
        value = float(text)
    except ValueError:
        raise OpenRebenchError(f"{where}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise OpenRebenchError(f"{where}: {column} {text!r} is not a finite number")
    if positive and value <= 0:
        raise OpenRebenchError(f"{where}: {column} {text!r} must be positive")
    if column == "normalized_score" and value < 0:
        raise OpenRebenchError(f"{where}: normalized_score {text!r} is negative (normalised scores are "
                               "floored at 0)")
    return value


def _choice(row: dict[str, str], column: str, known: Sequence[str], where: str) -> str:
    value = (row.get(column) or "").strip()
    if value not in known:
        raise OpenRebenchError(f"{where}: unknown {column} {value!r} (known: {', '.join(known)})")
    return value


def by_rebench_id() -> dict[str, EnvFacts]:
    """Environments by RE-Bench id, so that the paper's runs and ours meet on one environment id: the
    registered environments (the first by id where several share a RE-Bench id), then the release's
    own facts for the environments not registered."""
    found: dict[str, EnvFacts] = {}
    for facts in registered_facts().values():
        if facts.rebench_id:
            found.setdefault(facts.rebench_id, facts)
    for facts in RELEASE_ONLY_ENVIRONMENTS:
        found.setdefault(facts.rebench_id or facts.env_id, facts)
    return found


def _environment_of(data: Dataset) -> Callable[[str, str], str]:
    """Our id for a row's RE-Bench task id (its facts go into `data`), else a one-line error."""
    known = by_rebench_id()

    def env(task_id: str, where: str) -> str:
        try:
            facts = known[task_id]
        except KeyError:
            raise OpenRebenchError(f"{where}: unknown RE-Bench task '{task_id}'") from None
        data.env_facts.setdefault(facts.env_id, facts)
        return facts.env_id

    return env


def parse_hours(text: str) -> tuple[float, float] | None:
    """`--human-hours`: 'MIN-MAX' in hours ('7-9', '0-24'), or 'all' for every attempt (None)."""
    if text.strip().lower() == "all":
        return None
    low, sep, high = text.partition("-")
    try:
        window = (float(low), float(high)) if sep else (math.nan, math.nan)
    except ValueError:
        window = (math.nan, math.nan)
    if not (all(math.isfinite(x) for x in window) and 0 <= window[0] < window[1]):
        raise OpenRebenchError(f"bad --human-hours '{text}' (use MIN-MAX in hours, e.g. 7-9, or 'all')")
    return window


def _fmt_window(window: tuple[float, float] | None) -> str:
    return "every length" if window is None else f"{window[0]:g} to {window[1]:g} hours"


def _humans(rows: list[dict[str, str]], human_rows: HumanRows, window: tuple[float, float] | None,
            data: Dataset, env_of: Callable[[str, str], str]) -> list[HumanCount]:
    """Human attempts into `data` by the chosen rows and lengths; the counts kept per environment."""
    real = []
    for i, row in enumerate(rows, 2):
        where = f"{HUMANS_FILE}:{i}"
        env = env_of(row["env"], where)
        likely = _choice(row, "paper71_inferred", PAPER71, where)
        if _choice(row, "status", STATUSES, where) == "real":  # the other rows are not attempts
            real.append((i, row, env, likely, _number(row, "normalized_score", where),
                         _number(row, "hours", where, positive=True)))
    if not real:
        raise OpenRebenchError(f"{HUMANS_FILE} has no rows with status 'real' (actual attempts)")
    # The guess marks no row 'likely' in some environments (fix_embedding, scaling_law): there it has
    # nothing to go on, and its 'unknown' rows stand in, so that every environment keeps its humans.
    with_likely = {p[2] for p in real if p[3] == "likely"}
    counts = {env: HumanCount(env_id=env, released=0, kept=0) for env in sorted({p[2] for p in real})}
    for i, row, env, likely, score, hours in real:
        c = counts[env]
        c.released += 1
        chosen = likely == "likely" or (likely == "unknown" and env not in with_likely)
        if human_rows == "likely71" and not chosen:
            c.not_selected += 1
            continue
        if window is not None and hours < window[0]:
            c.too_short += 1
            continue
        if window is not None and hours > window[1]:
            c.too_long += 1
            continue
        c.kept += 1
        data.attempts.append(Attempt(
            group=HUMAN_GROUP, is_human=True, env_id=env, tier=PAPER_TIER, length_h=HUMAN_ATTEMPT_HOURS,
            score=score, raw=_number(row, "raw_score", f"{HUMANS_FILE}:{i}", empty=math.nan) if row.get(
                "raw_score") else None, hours_used=hours, run_id=str(row["attempt_id"]),
            source=f"paper:{HUMANS_FILE}:{i} (attempt {row['attempt_id']})"))
    empty = [env for env, c in counts.items() if c.kept == 0]
    if empty:
        raise OpenRebenchError(f"no human attempts left in {', '.join(empty)} with rows '{human_rows}' and "
                               f"lengths {_fmt_window(window)}: widen --human-hours or choose other rows")
    return list(counts.values())


def _humans_text(human_rows: HumanRows, window: tuple[float, float] | None, counts: list[HumanCount],
                 n_rows: int, others: dict[str, int]) -> str:
    kept = sum(c.kept for c in counts)
    short = sum(c.too_short for c in counts)
    long = sum(c.too_long for c in counts)
    rows = ("the real rows" if human_rows == "real" else
            "the rows likely among the paper's 71 (and, where the guess marks none likely, the unknown ones)")
    text = (f"Human attempts: {kept} of the release's {sum(c.released for c in counts)} real attempts, from "
            f"{rows}, of {_fmt_window(window)}")
    dropped = [f"{n} shorter" for n in [short] if n] + [f"{n} longer (their final score overstates an "
                                                          "8-hour one)" for n in [long] if n]
    if dropped:
        text += " (left out: " + ", ".join(dropped) + ")"
    left = ", ".join(f"{n} {why}" for why, n in sorted(others.items()))
    return text + f"; {n_rows - sum(c.released for c in counts)} rows are not attempts ({left})."


def _suspects(agents: list[Attempt], later: dict[str, float | None], best_human: dict[str, float]
              ) -> list[AlteredRun]:
    """Runs that look like reward hacks: zeroed by METR's later release, or far above every human."""
    out = []
    for a in agents:
        assert a.run_id is not None
        zeroed = later.get(a.run_id) == 0.0 and a.score > 0
        above = a.env_id in best_human and a.score > HACK_FACTOR * best_human[a.env_id]
        if not (zeroed or above):
            continue
        why = []
        if zeroed:
            why.append(f"METR's later renormalisation ({LATER_COLUMN}) scores it 0 while only capping the "
                       "other runs at 1: judged a reward hack")
        if above:
            why.append(f"above {HACK_FACTOR:g}× the best human attempt in its environment "
                       f"({best_human[a.env_id]:.2f})")
            if not zeroed and later.get(a.run_id) is not None:
                why.append(f"the later renormalisation keeps it (at {later[a.run_id]:.2f}, capped)")
        out.append(AlteredRun(run_id=a.run_id, group=a.group, env_id=a.env_id, length_h=a.length_h,
                              released=a.score, used=a.score, reason="; ".join(why)))
    return out


def _treat(hacks: Hacks, suspects: list[AlteredRun], later: dict[str, float | None]) -> list[AlteredRun]:
    altered = []
    for s in suspects:
        if (hacks == "paper" and later.get(s.run_id) == 0.0) or hacks == "zero":
            used = 0.0
        elif hacks == "cap":
            used = min(s.released, CAP)
        else:
            continue
        if used != s.released:
            altered.append(s.model_copy(update={"used": used}))
    return altered


HACKS_TEXT = {
    "paper": ("the paper's treatment: runs judged as cheating score 0 (the paper zeroed such runs after "
              "review; which runs, the release does not say: those METR's later renormalisation zeroes)"),
    "keep": "released scores kept as they are (no run treated as a reward hack)",
    "zero": f"every suspect run (zeroed later by METR, or above {HACK_FACTOR:g}× the best human) scores 0",
    "cap": f"every suspect run (zeroed later by METR, or above {HACK_FACTOR:g}× the best human) capped at "
           f"{CAP:g} (the reference)",
}


def load_paper(human_rows: HumanRows = "real", *, hacks: Hacks = "paper",
               human_hours: tuple[float, float] | None = PAPER_HUMAN_HOURS,
               data_dir: Path | None = None) -> Dataset:
    """The paper's data as attempts: human attempts by the chosen rows and lengths, every agent run (a
    run with no valid score counts 0) with reward hacks treated as `hacks` says; how, in `data.paper`."""
    if human_rows not in HUMAN_ROWS:
        raise OpenRebenchError(f"unknown --human-rows '{human_rows}' (known: {', '.join(HUMAN_ROWS)})")
    if hacks not in HACKS:
        raise OpenRebenchError(f"unknown --hacks '{hacks}' (known: {', '.join(HACKS)})")
    where = "packaged copy" if data_dir is None else str(data_dir)
    data = Dataset(sources=[f"RE-Bench paper data ({RELEASE}, {where})"])
    env_of = _environment_of(data)
    human_table = _read_csv(HUMANS_FILE, HUMAN_COLUMNS, data_dir)
    agent_table = _read_csv(AGENTS_FILE, AGENT_COLUMNS, data_dir)
    counts = _humans(human_table, human_rows, human_hours, data, env_of)
    others: dict[str, int] = {}
    for row in human_table:
        if row["status"] != "real":
            others[row["status"]] = others.get(row["status"], 0) + 1
    humans_text = _humans_text(human_rows, human_hours, counts, len(human_table), others)

    agents: list[Attempt] = []
    later: dict[str, float | None] = {}
    seen: dict[str, int] = {}
    unscored = 0
    has_later = LATER_COLUMN in agent_table[0]
    for i, row in enumerate(agent_table, 2):
        at = f"{AGENTS_FILE}:{i}"
        run_id = (row.get("run_id") or "").strip()
        if not run_id or not (row.get("agent_alias") or "").strip():
            raise OpenRebenchError(f"{at}: run_id and agent_alias must not be empty")
        if run_id in seen:
            raise OpenRebenchError(f"{at}: run {run_id} is given twice (also line {seen[run_id]})")
        seen[run_id] = i
        score = _number(row, "normalized_score", at, empty=math.nan)
        if math.isnan(score):  # no valid submission: the normalisation rule makes it 0
            unscored += 1
            score = 0.0
        length = _number(row, "time_limit_hours", at, positive=True)
        if has_later:
            value = _number(row, LATER_COLUMN, at, empty=math.nan)
            later[run_id] = None if math.isnan(value) else value
        agents.append(Attempt(
            group=row["agent_alias"].strip(), is_human=False, env_id=env_of(row["env"], at), tier=PAPER_TIER,
            length_h=length, score=score,
            hours_used=_number(row, "wall_hours", at, empty=math.nan) if row.get("wall_hours") else None,
            run_id=run_id, source=f"paper:{AGENTS_FILE}:{i} ({run_id})"))
    if hacks == "paper" and not has_later:
        raise OpenRebenchError(f"{AGENTS_FILE} lacks column {LATER_COLUMN}, which says which runs METR "
                               "zeroed as reward hacks: use --hacks keep, zero or cap")
    best_human: dict[str, float] = {}
    for row in human_table:  # the best of all real attempts: the suspects do not depend on the humans kept
        if row["status"] == "real":
            env = env_of(row["env"], HUMANS_FILE)
            best_human[env] = max(best_human.get(env, 0.0), _number(row, "normalized_score", HUMANS_FILE))
    suspects = _suspects(agents, later, best_human)
    altered = _treat(hacks, suspects, later)
    by_id = {r.run_id: r for r in altered}
    for j, a in enumerate(agents):
        if a.run_id in by_id:
            r = by_id[a.run_id]
            agents[j] = a.model_copy(update={"score": r.used, "released_score": r.released,
                                             "altered": f"{hacks}: {r.reason}"})
    data.attempts.extend(agents)
    data.paper = PaperTreatment(
        hacks=hacks, hacks_text=HACKS_TEXT[hacks], human_rows=human_rows, human_hours=human_hours,
        humans_text=humans_text, human_counts=counts, suspects=suspects, altered=altered,
        data=data.sources[0])
    data.notes.append(humans_text)
    data.notes.append(f"Reward hacks: {HACKS_TEXT[hacks]}; "
                      + ("; ".join(f"{r.group} on {r.env_id} ({r.run_id}) {r.released:.2f} → {r.used:.2f}"
                                   for r in altered) or "no run changed") + ".")
    data.notes.append("the release has final scores only: no score-over-time, token or GPU-hour data")
    if unscored:
        data.notes.append(f"{unscored} agent runs have no normalised score in the release (no valid "
                          "submission); counted as 0")
    data.notes.append("agent scaffolds (Modular vs AIDE) are not recorded in the release: each model's "
                      "runs are pooled across scaffolds")
    return data


def paper_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments of `load_paper` from a partial set (the defaults filled in)."""
    out: dict[str, Any] = {"human_rows": "real", "hacks": "paper", "human_hours": PAPER_HUMAN_HOURS,
                           "data_dir": None}
    out.update(options or {})
    return out


def describe_options(options: dict[str, Any]) -> str:
    """The command-line flags that give these options (empty for the defaults)."""
    o = paper_options(options)
    flags = []
    if o["hacks"] != "paper":
        flags.append(f"--hacks {o['hacks']}")
    if o["human_rows"] != "real":
        flags.append(f"--human-rows {o['human_rows']}")
    if o["human_hours"] != PAPER_HUMAN_HOURS:
        w = o["human_hours"]
        flags.append("--human-hours " + ("all" if w is None else f"{w[0]:g}-{w[1]:g}"))
    return " ".join(flags)
