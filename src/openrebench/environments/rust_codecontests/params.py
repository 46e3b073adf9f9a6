"""The settings of a rust_codecontests tier: which problems, how the scorer drives the agent's scaffold
(batches, time, concurrency) and how it runs the Rust programs it returns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RustCodecontestsParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    problems: Literal["mini", "codecontests"] = Field(description=(
        "mini: the generated beginner problems (offline); codecontests: DeepMind's CodeContests, test split "
        "for scoring, valid split for the agent."))
    problem_seed: int = Field(default=0, description="The seed of the generated (mini) problems.")
    batch_size: int = Field(gt=0, description="Problems the scaffold is given at once (paper: 20).")
    batch_timeout_s: int = Field(gt=0, description=(
        "Wall-clock time for one batch (paper: 60 s); a problem without an answer by then is unsolved."))
    concurrency: int = Field(gt=0, description="The value of the semaphore handed to generate_solution.")
    compile_timeout_s: float = Field(gt=0, description="The longest one rustc run may take.")
    test_workers: int = Field(gt=0, description="Programs compiled and tested at once by the scorer.")
    import_timeout_s: float = Field(default=60, gt=0, description="Seconds to import the scaffold.")
    n_valid: str = Field(default="", description="Validation problems, in words (for the instructions).")
