"""What the analysis reads: attempts from our Inspect logs and from the paper's data, in one shape."""

from __future__ import annotations

from pydantic import BaseModel, Field

from openrebench.api import Direction


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
    score: float = Field(description="Final normalised score (0 = start, 1 = reference).")
    raw: float | None = None
    trajectory: list[tuple[float, float | None]] | None = Field(
        default=None, description="(elapsed hours, normalised score or None when invalid) per scoring.")
    tokens: int | None = Field(default=None, description="The agent's model tokens (Inspect's usage).")
    cost_usd: float | None = Field(default=None, description="The agent's model cost in US$.")
    env_models: ModelUse | None = Field(
        default=None, description="The environment's own model calls (the gateway's totals); None: none.")
    env_roles: dict[str, ModelUse] = Field(default_factory=dict, description="The same by model role.")
    gpu_hours: float | None = None
    hours_used: float | None = Field(default=None, description="Working hours the run actually took.")
    source: str = Field(description="Where the attempt came from (log file and sample, or data row).")


class Dataset(BaseModel):
    """Attempts plus everything a reader must know about how they were read."""

    attempts: list[Attempt] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="Problems in the input, each one line.")
    notes: list[str] = Field(default_factory=list, description="Caveats of the data (not errors).")
    env_facts: dict[str, EnvFacts] = Field(
        default_factory=dict, description="What the loader learnt of the attempts' environments, by id "
                                          "(the analysis asks the registry for any not here).")

    def __add__(self, other: Dataset) -> Dataset:
        return Dataset(attempts=self.attempts + other.attempts, sources=self.sources + other.sources,
                       warnings=self.warnings + other.warnings, notes=self.notes + other.notes,
                       env_facts={**other.env_facts, **self.env_facts})

    def environments(self) -> list[str]:
        return sorted({a.env_id for a in self.attempts})
