"""What the analysis reads: attempts from our Inspect logs and from the paper's data, in one shape."""

from __future__ import annotations

from pydantic import BaseModel, Field

# RE-Bench task ids and ours (DESIGN.md), so that the paper's runs and ours meet on one environment id.
REBENCH_TO_OURS: dict[str, str] = {
    "ai_rd_triton_cumsum": "optimize_kernel",
    "ai_rd_optimize_llm_foundry": "optimize_finetune",
    "ai_rd_fix_embedding": "fix_embedding",
    "ai_rd_small_scaling_law": "scaling_law",
    "ai_rd_restricted_mlm": "restricted_mlm",
    "ai_rd_nanogpt_chat_rl": "chat_rl",
    "ai_rd_rust_codecontests_inference": "rust_codecontests",
}

# Environments whose score the agent cannot see: best-of-k picks a random run, not the best one
# (nobody could pick the best), and the score at a time is the last valid submission so far.
HIDDEN_SCORE_ENVS: frozenset[str] = frozenset({"scaling_law"})


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
    tokens: int | None = None
    cost_usd: float | None = None
    gpu_hours: float | None = None
    hours_used: float | None = Field(default=None, description="Working hours the run actually took.")
    source: str = Field(description="Where the attempt came from (log file and sample, or data row).")


class Dataset(BaseModel):
    """Attempts plus everything a reader must know about how they were read."""

    attempts: list[Attempt] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="Problems in the input, each one line.")
    notes: list[str] = Field(default_factory=list, description="Caveats of the data (not errors).")

    def __add__(self, other: Dataset) -> Dataset:
        return Dataset(attempts=self.attempts + other.attempts, sources=self.sources + other.sources,
                       warnings=self.warnings + other.warnings, notes=self.notes + other.notes)

    def environments(self) -> list[str]:
        return sorted({a.env_id for a in self.attempts})
