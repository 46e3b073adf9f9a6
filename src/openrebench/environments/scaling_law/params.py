"""The settings of a scaling_law tier: the fixed training setup of every experiment, the ground-truth
sweep, the reference procedure, the starting answer, and the budgets as the instructions word them.

`Setup` is here, with the tier's other params, so that listing the environments imports no torch;
`experiment.py` (which the agent's train.py, the sweep and the reference all run) re-exports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from openrebench.lm import GPTConfig, TrainConfig


class Setup(BaseModel):
    """Everything about an experiment except n_embd and max_iters; fixed per tier."""

    model_config = ConfigDict(frozen=True)

    vocab_size: int = Field(gt=0)
    block_size: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    head_size: int = Field(gt=0, description="n_head = n_embd / head_size.")
    batch_size: int = Field(gt=0, description="Sequences per step (tokens: batch_size · block_size).")
    learning_rate: float = Field(gt=0, description="Peak; cosine decay to a tenth of it at max_iters.")
    warmup_fraction: float = Field(ge=0, lt=1, description="Linear warm-up over this share of max_iters.")
    weight_decay: float = 0.1
    target_flops: float = Field(gt=0, description="The budget the answer is for.")
    cap_flops: float = Field(gt=0, description="The most one experiment may use.")
    budget_tolerance: float = Field(gt=0, lt=1, description="An answer must use target · (1 ± this).")
    n_embd_min: int = Field(gt=0, description="Smallest width an answer may choose.")
    n_embd_max: int = Field(gt=0, description="Largest width an answer may choose.")
    eval_batches: int = Field(gt=0)
    eval_batch_size: int = Field(gt=0)
    eval_seed: int = 1234

    @property
    def tokens_per_iter(self) -> int:
        return self.batch_size * self.block_size

    def width_problem(self, n_embd: int, *, answer: bool = False) -> str | None:
        """Why `n_embd` cannot be used (None if it can); answers must also lie in the allowed range."""
        if n_embd < self.head_size or n_embd % self.head_size:
            return f"n_embd must be a positive multiple of {self.head_size} (the head size), got {n_embd}"
        if answer and not self.n_embd_min <= n_embd <= self.n_embd_max:
            return f"n_embd must be between {self.n_embd_min} and {self.n_embd_max}, got {n_embd}"
        return None

    def gpt_config(self, n_embd: int) -> GPTConfig:
        from openrebench.lm import GPTConfig  # here, not at the top: listing environments imports no torch

        return GPTConfig(block_size=self.block_size, vocab_size=self.vocab_size, n_layer=self.n_layer,
                         n_head=n_embd // self.head_size, n_embd=n_embd, dropout=0.0, bias=True)

    def params(self, n_embd: int) -> int:
        """N of the FLOP formula: token embedding (tied output layer), blocks, final LayerNorm."""
        d = n_embd
        return self.vocab_size * d + self.n_layer * (12 * d * d + 13 * d) + 2 * d

    def flops_per_token(self, n_embd: int) -> int:
        return 6 * self.params(n_embd) + 12 * self.n_layer * n_embd * self.block_size

    def flops(self, n_embd: int, max_iters: int) -> float:
        return float(self.flops_per_token(n_embd)) * max_iters * self.tokens_per_iter

    def max_iters_for(self, n_embd: int, flops: float) -> int:
        """The number of steps that spends `flops` at this width (rounded to the nearest step)."""
        return max(1, round(flops / (self.flops_per_token(n_embd) * self.tokens_per_iter)))

    def train_config(self, max_iters: int, *, seed: int, device: str) -> TrainConfig:
        from openrebench.lm import TrainConfig

        return TrainConfig(max_iters=max_iters, batch_size=self.batch_size, block_size=self.block_size,
                           learning_rate=self.learning_rate, weight_decay=self.weight_decay,
                           warmup_iters=max(1, round(self.warmup_fraction * max_iters)),
                           eval_batches=1, log_interval=max(1, max_iters // 20), seed=seed, device=device,
                           checkpoint_interval_s=1e9)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Sweep(_Frozen):
    """The ground truth: losses at the target budget over these widths, averaged over these seeds."""

    widths: list[int]
    seeds: list[int]


class ReferenceProcedure(_Frozen):
    """The reference answer's own experiments (reference/fit.py): an IsoFLOP grid under the cap."""

    budget_fractions: list[float] = Field(description="Experiment budgets as fractions of the cap.")
    widths: list[int]
    min_iters: int = Field(gt=0, description="Fewest steps an experiment of the grid may have.")
    seed: int


class StartingAnswer(_Frozen):
    """The starting solution's naive answer: the widest model allowed, with a round-number loss."""

    n_embd: int = Field(gt=0)
    loss_prediction: float


class ScalingLawParams(_Frozen):
    corpus: Literal["mini", "full"] = Field(description="The corpus experiments train and evaluate on.")
    setup: Setup
    sweep: Sweep
    reference: ReferenceProcedure
    start: StartingAnswer
    target: str = Field(description="The target budget as the instructions write it.")
    cap: str = Field(description="The per-experiment cap as the instructions write it.")
    tolerance: str = Field(description="How far from the target an answer's budget may be, in words.")
    widths: str = Field(description="The widths an answer may choose, in words.")
