"""The fixed training setup of scaling_law: only the width (n_embd) and the number of steps vary.

One definition serves the agent's `train.py`, the ground-truth sweep and the reference procedure, so
that a run the agent makes and a point of the sweep are the same computation. FLOPs follow the
formula of nanoGPT's `estimate_mfu` (PaLM, appendix B): 6·N + 12·n_layer·n_embd·block_size per
token, N counting every parameter except the position embeddings (the tied token embedding counts
once, as the output layer's matmul).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, Field

from openrebench.lm import GPT, GPTConfig, TrainConfig, evaluate, train

TokenData = np.ndarray | Path | str


class Setup(BaseModel):
    """Everything about an experiment except n_embd and max_iters; fixed per tier."""

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
        return TrainConfig(max_iters=max_iters, batch_size=self.batch_size, block_size=self.block_size,
                           learning_rate=self.learning_rate, weight_decay=self.weight_decay,
                           warmup_iters=max(1, round(self.warmup_fraction * max_iters)),
                           eval_batches=1, log_interval=max(1, max_iters // 20), seed=seed, device=device,
                           checkpoint_interval_s=1e9)


class Result(BaseModel):
    """One experiment: the losses of a model trained with (n_embd, max_iters)."""

    n_embd: int
    max_iters: int
    seed: int
    flops: float
    params: int
    tokens: int
    loss: float = Field(description="Mean loss on the evaluation split (fixed windows).")
    seconds: float


class OverCap(ValueError):
    """An experiment that would use more than the per-experiment FLOP cap."""


def run_experiment(setup: Setup, n_embd: int, max_iters: int, train_data: TokenData, eval_data: TokenData, *,
                   seed: int = 0, device: str = "cpu", enforce_cap: bool = True,
                   progress: bool = False) -> Result:
    """Train a fresh model for `max_iters` steps at width `n_embd` and measure its loss on `eval_data`."""
    problem = setup.width_problem(n_embd)
    if problem:
        raise ValueError(problem)
    flops = setup.flops(n_embd, max_iters)
    if enforce_cap and flops > setup.cap_flops * (1 + 1e-9):
        most = math.floor(setup.cap_flops / (setup.flops_per_token(n_embd) * setup.tokens_per_iter))
        raise OverCap(f"n_embd={n_embd}, max_iters={max_iters} needs {flops:.3g} FLOPs, over the cap of "
                      f"{setup.cap_flops:.3g} per experiment (at most max_iters={most} at this width)")
    started = time.monotonic()
    torch.manual_seed(seed)
    model = GPT(setup.gpt_config(n_embd))
    train(model, train_data, setup.train_config(max_iters, seed=seed, device=device), progress=progress)
    loss = evaluate(model, eval_data, batches=setup.eval_batches, batch_size=setup.eval_batch_size,
                    block_size=setup.block_size, seed=setup.eval_seed)
    return Result(n_embd=n_embd, max_iters=max_iters, seed=seed, flops=flops, params=setup.params(n_embd),
                  tokens=max_iters * setup.tokens_per_iter, loss=loss, seconds=time.monotonic() - started)
