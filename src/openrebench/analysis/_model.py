"""What the analysis reads: attempts from our Inspect logs and from the paper's data, in one shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from openrebench.api import Direction, NormConstants

Normalisation = Literal["measured", "paper"]


class EnvFacts(BaseModel):
    """What the analysis must know of one environment, and where it learnt it: from the registered
    environment's own class, from the paper's release (environments not implemented here), or from the
    log of an environment that is no longer installed."""

    env_id: str = Field(description="openrebench environment id.")
    rebench_id: str | None = Field(default=None, description="RE-Bench task id, where there is one.")
    score_visible: bool = Field(
        default=True, description="Whether the agent sees its score. Where not, best-of-k takes a random "
                                  "run of the k, not the best one (nobody could have picked the best).")
    direction: Direction | None = Field(
        default=None, description="Which valid scoring is a run's score: `last` makes a run's score at a "
                                  "time the last valid one so far, else the best so far.")
    source: str = Field(description="Where these facts come from.")
    paper_constants: NormConstants | None = Field(
        default=None, description="The paper's start and reference raw scores, for the paper-matched "
                                  "normalisation of logs written before score rows carried it.")

    @property
    def last_counts(self) -> bool:
        return self.direction is Direction.LAST


class ModelUse(BaseModel):
    """Calls to an environment's own models through the harness's gateway (a run's, or one role's):
    kept apart from the agent's model usage, which Inspect records."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = Field(default=0.0, description="None: a model without a known price was used.")
    failures: int = Field(default=0, description="Requests refused (budget, role) or failed upstream.")

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: ModelUse) -> ModelUse:
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return ModelUse(requests=self.requests + other.requests,
                        input_tokens=self.input_tokens + other.input_tokens,
                        output_tokens=self.output_tokens + other.output_tokens, cost_usd=cost,
                        failures=self.failures + other.failures)


class Attempt(BaseModel):
    """One run (an agent's or a person's attempt) at one environment."""

    group: str = Field(description="Who made the attempt: an agent with its model and tier, or humans.")
    is_human: bool
    env_id: str = Field(description="openrebench environment id (paper task ids are mapped to ours).")
    tier: str = Field(description="mini, full, or 'paper' for the paper's data.")
    length_h: float = Field(description="The run's time limit L in hours.")
    score: float = Field(description="Final normalised score (0 = start, 1 = reference), on the scale the "
                                     "analysis uses (see `scores`).")
    raw: float | None = None
    trajectory: list[tuple[float, float | None]] | None = Field(
        default=None, description="(elapsed hours, normalised score or None when invalid) per scoring.")
    scores: dict[Normalisation, float] = Field(
        default_factory=dict, description="Our runs: the final score on each scale, 'measured' (this "
                                          "machine's start and reference) and 'paper' (paper-matched: the "
                                          "paper's start-to-reference gap from the start measured here). "
                                          "Empty for the paper's own runs, which are on the paper's scale.")
    trajectories: dict[Normalisation, list[tuple[float, float | None]]] = Field(
        default_factory=dict, description="The score log on each scale, as `scores`.")
    scale: Normalisation | None = Field(default=None, description=(
        "Our runs: the scale `score` is on, once the analysis has chosen one (None: not chosen yet, or the "
        "paper's own runs, which are on the paper's scale)."))
    constants: NormConstants | None = Field(default=None, description="Our runs: the constants measured "
                                                                      "for the run (its fingerprint).")
    paper_constants: NormConstants | None = Field(default=None, description="The paper's constants used "
                                                                            "for the paper-matched score.")
    run_id: str | None = Field(default=None, description="The release's run or attempt id.")
    scaffold: str | None = Field(default=None, description="The agent scaffold where recorded (ours: the "
                                                           "agent's name); None: not recorded.")
    released_score: float | None = Field(
        default=None, description="The score as released, where the analysis changed it (reward hacks).")
    altered: str | None = Field(default=None, description="Why the score differs from the released one.")
    tokens: int | None = Field(default=None, description="The agent's model tokens (Inspect's usage).")
    cost_usd: float | None = Field(default=None, description="The agent's model cost in US$.")
    env_models: ModelUse | None = Field(
        default=None, description="The environment's own model calls (the gateway's totals); None: none.")
    env_roles: dict[str, ModelUse] = Field(default_factory=dict, description="The same by model role.")
    gpu_hours: float | None = None
    hours_used: float | None = Field(default=None, description="Working hours the run actually took.")
    source: str = Field(description="Where the attempt came from (log file and sample, or data row).")


class HumanCount(BaseModel):
    """How many of an environment's released human attempts a choice of rows and lengths keeps."""

    env_id: str
    released: int = Field(description="Rows with status 'real' (actual attempts).")
    kept: int
    too_short: int = 0
    too_long: int = 0
    not_selected: int = Field(default=0, description="Outside the chosen rows (e.g. not likely among "
                                                     "the paper's 71).")


class AlteredRun(BaseModel):
    """A run whose released score the analysis does not use as it is."""

    run_id: str
    group: str
    env_id: str
    length_h: float
    released: float
    used: float
    reason: str


class PaperTreatment(BaseModel):
    """How the paper's data was read: what was kept, changed or left out, and why, each in a line."""

    hacks: str
    hacks_text: str
    human_rows: str
    human_hours: tuple[float, float] | None
    humans_text: str
    human_counts: list[HumanCount]
    suspects: list[AlteredRun] = Field(description="Runs that look like reward hacks, whatever is done "
                                                   "with them (see `hacks`).")
    altered: list[AlteredRun] = Field(description="Runs whose score was changed under this treatment.")
    data: str = Field(description="Where the data was read from.")


class Dataset(BaseModel):
    """Attempts plus everything a reader must know about how they were read."""

    attempts: list[Attempt] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="Problems in the input, each one line.")
    notes: list[str] = Field(default_factory=list, description="Caveats of the data (not errors).")
    env_facts: dict[str, EnvFacts] = Field(
        default_factory=dict, description="What the loader learnt of the attempts' environments, by id "
                                          "(the analysis asks the registry for any not here).")
    paper: PaperTreatment | None = Field(default=None, description="How the paper's data was read, when "
                                                                   "it is part of the data.")

    def __add__(self, other: Dataset) -> Dataset:
        return Dataset(attempts=self.attempts + other.attempts, sources=self.sources + other.sources,
                       warnings=self.warnings + other.warnings, notes=self.notes + other.notes,
                       env_facts={**other.env_facts, **self.env_facts}, paper=self.paper or other.paper)

    def environments(self) -> list[str]:
        return sorted({a.env_id for a in self.attempts})


def with_normalisation(data: Dataset, which: Normalisation,
                       tiers: Mapping[str, Normalisation] | None = None) -> tuple[Dataset, list[str]]:
    """The data with our runs' scores and score logs on one scale (the paper's runs are on the paper's
    already), or on the scale `tiers` names for a run's tier (`which` for the others), and a note for runs
    that have no score on that scale (kept on the measured one)."""
    attempts, lacking = [], 0
    for a in data.attempts:
        if not a.scores:
            attempts.append(a)
            continue
        wanted = (tiers or {}).get(a.tier, which)
        if wanted not in a.scores:
            lacking += 1
            which_here: Normalisation = "measured"
        else:
            which_here = wanted
        attempts.append(a.model_copy(update={"score": a.scores[which_here], "scale": which_here,
                                             "trajectory": a.trajectories.get(which_here, a.trajectory)}))
    notes = [f"{lacking} of our runs have no paper-matched score (their environment declares no paper "
             "constants): they stay on the measured scale"] if lacking else []
    return data.model_copy(update={"attempts": attempts}), notes
