"""The paper's human attempts and agent runs (packaged copy), and the numbers the paper published."""

from __future__ import annotations

import csv
from collections.abc import Callable
from importlib import resources
from typing import Literal

from pydantic import BaseModel

from openrebench.api import Direction, OpenRebenchError

from ._environments import registered_facts
from ._model import Attempt, Dataset, EnvFacts

HUMAN_GROUP = "Human experts (paper)"
PAPER_TIER = "paper"
HUMAN_ATTEMPT_HOURS = 8.0
# The two agents of the paper's main comparison (arXiv 2411.15114, section 4); the release also
# holds older models and o1, which the first version of the paper did not evaluate.
PAPER_MAIN_AGENTS: tuple[str, ...] = ("Claude 3.5 Sonnet (New)", "o1-preview")

HumanRows = Literal["real", "likely71"]

_RELEASE = "the paper's release (not implemented here)"
# The release covers seven RE-Bench environments; everything the analysis needs of the five that
# openrebench implements comes from their registered classes. These are the other two, as facts of
# the release: our id for each, and that, as in every RE-Bench environment but the scaling-law one,
# the agent sees its score and a run's best valid score counts (both are higher-is-better: a win rate
# and a share of problems solved). A registered environment with the same RE-Bench id replaces its
# entry here: its own attributes win.
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


def _data_file(name: str):
    return resources.files("openrebench.analysis").joinpath("data", "rebench_paper", name)


def _read_csv(name: str) -> list[dict[str, str]]:
    try:
        with _data_file(name).open("r", encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise OpenRebenchError(f"the packaged paper data is missing ({name}: {e.strerror}); "
                               "reinstall openrebench") from None


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


def load_paper(human_rows: HumanRows = "real") -> Dataset:
    """The paper's data as attempts: human rows with status `real` (or only those likely among the
    paper's 71 attempts), and every agent run (a run with no valid score counts 0)."""
    data = Dataset(sources=["RE-Bench paper data (METR/eval-analysis-public@3a947ac, packaged copy)"])
    humans = _read_csv("human_baselines.csv")
    _env = _environment_of(data)
    left_out: dict[str, int] = {}
    long_runs: list[float] = []
    for i, row in enumerate(humans, 2):
        keep = row["status"] == "real" and (human_rows == "real" or row["paper71_inferred"] == "likely")
        if not keep:
            reason = row["status"] if row["status"] != "real" else "not likely among the paper's 71"
            left_out[reason] = left_out.get(reason, 0) + 1
            continue
        hours = float(row["hours"])
        if hours > HUMAN_ATTEMPT_HOURS + 0.5:
            long_runs.append(hours)
        data.attempts.append(Attempt(
            group=HUMAN_GROUP, is_human=True, env_id=_env(row["env"], f"human_baselines.csv:{i}"),
            tier=PAPER_TIER, length_h=HUMAN_ATTEMPT_HOURS, score=float(row["normalized_score"]),
            raw=float(row["raw_score"]) if row["raw_score"] else None, hours_used=hours,
            source=f"paper:human_baselines.csv:{i} (attempt {row['attempt_id']})"))
    n_humans = sum(a.is_human for a in data.attempts)
    data.notes.append(f"human attempts: {n_humans} rows used ({human_rows}); left out: "
                      + ", ".join(f"{n} {why}" for why, n in sorted(left_out.items())))
    if long_runs:
        data.notes.append(f"{len(long_runs)} human attempts ran longer than 8.5 h (up to "
                          f"{max(long_runs):g} h); "
                          "their final scores overstate an 8-hour score (the release has no trajectories "
                          "to cut them at 8 h)")
    data.notes.append("the release has final scores only: no score-over-time, token or GPU-hour data")
    unscored = 0
    for i, row in enumerate(_read_csv("agent_runs.csv"), 2):
        score = row["normalized_score"]
        if not score:
            unscored += 1
        data.attempts.append(Attempt(
            group=row["agent_alias"], is_human=False, env_id=_env(row["env"], f"agent_runs.csv:{i}"),
            tier=PAPER_TIER, length_h=float(row["time_limit_hours"]), score=float(score) if score else 0.0,
            hours_used=float(row["wall_hours"]) if row["wall_hours"] else None,
            source=f"paper:agent_runs.csv:{i} ({row['run_id']})"))
    if unscored:
        data.notes.append(f"{unscored} agent runs have no normalised score in the release (no valid "
                          "submission); counted as 0")
    data.notes.append("agent scaffolds (Modular vs AIDE) are not recorded in the release: each model's "
                      "runs are pooled across scaffolds")
    return data
