"""One experiment of scaling_law: a fixed training setup (`Setup`, kept with the tier's params) in which
only the width (n_embd) and the number of steps vary.

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
from pydantic import BaseModel, Field

from .params import Setup

TokenData = np.ndarray | Path | str

__all__ = ["OverCap", "Result", "Setup", "TokenData", "run_experiment"]


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
    import torch  # here, not at the top: the scorer reads `Result` and trains nothing (2 s less a scoring)

    from openrebench.lm import GPT, evaluate, train

    started = time.monotonic()
    torch.manual_seed(seed)
    model = GPT(setup.gpt_config(n_embd))
    train(model, train_data, setup.train_config(max_iters, seed=seed, device=device), progress=progress)
    loss = evaluate(model, eval_data, batches=setup.eval_batches, batch_size=setup.eval_batch_size,
                    block_size=setup.block_size, seed=setup.eval_seed)
    return Result(n_embd=n_embd, max_iters=max_iters, seed=seed, flops=flops, params=setup.params(n_embd),
                  tokens=max_iters * setup.tokens_per_iter, loss=loss, seconds=time.monotonic() - started)
