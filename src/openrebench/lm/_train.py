"""One training loop for every GPT in the benchmark, and one evaluation.

AdamW, linear warm-up then cosine decay, gradient clipping and accumulation; on CUDA bf16 autocast and
optionally torch.compile, on CPU plain fp32. Batches are random windows of a token file, drawn from a
generator seeded by (seed, step, micro-step), so a run resumed from a checkpoint sees exactly the batches
an uninterrupted run would (and on CPU ends with the same weights).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

from openrebench.api import progress_display, stage

from ._checkpoint import has_checkpoint, load_checkpoint, save_checkpoint, unwrap
from ._model import GPT

TokenData = np.ndarray | Path | str


class TrainConfig(BaseModel):
    """How to train; persisted with checkpoints and in asset manifests."""

    max_iters: int = Field(1000, ge=0)
    batch_size: int = Field(12, gt=0, description="Sequences per micro-step.")
    grad_accum_steps: int = Field(1, gt=0, description="Micro-steps per optimizer step.")
    block_size: int | None = Field(None, description="Sequence length; default: the model's block_size.")
    learning_rate: float = 6e-4
    min_lr: float | None = Field(None, description="Floor of the cosine; default learning_rate / 10.")
    warmup_iters: int = Field(100, ge=0)
    lr_decay_iters: int | None = Field(None, description="End of the cosine; default max_iters.")
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 turns it off.")
    eval_interval: int = Field(0, ge=0, description="Validation loss every N steps (0: only at the end).")
    eval_batches: int = Field(20, gt=0)
    checkpoint_interval_s: float = Field(300.0, gt=0, description="Seconds between resumable checkpoints.")
    log_interval: int = Field(10, gt=0)
    seed: int = 0
    device: str = Field("auto", description="'auto' (CUDA if present), 'cpu', 'cuda', 'cuda:1'...")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Autocast dtype on CUDA "
                                                           "('auto': bfloat16 where supported); CPU is fp32.")
    compile: bool = Field(False, description="torch.compile the model (CUDA only).")


class TrainResult(BaseModel):
    iters: int
    finished: bool = Field(description="False when the time budget stopped training before max_iters.")
    train_loss: float | None = None
    val_loss: float | None = None
    tokens_seen: int
    elapsed_s: float
    history: list[dict[str, int | float]] = Field(default_factory=list)


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if device.type != "cuda" or dtype == "float32":
        return contextlib.nullcontext()
    if dtype == "auto" and not torch.cuda.is_bf16_supported():
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16)


def learning_rate(it: int, config: TrainConfig) -> float:
    """Linear warm-up to `learning_rate`, then cosine decay to `min_lr` at `lr_decay_iters`."""
    lr = config.learning_rate
    min_lr = config.min_lr if config.min_lr is not None else lr / 10
    decay_iters = config.lr_decay_iters if config.lr_decay_iters is not None else config.max_iters
    if it < config.warmup_iters:
        return lr * (it + 1) / (config.warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    progress = (it - config.warmup_iters) / max(1, decay_iters - config.warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def load_tokens(data: TokenData) -> np.ndarray:
    """A token array; `.bin` paths open as read-only uint16 memmaps (nothing read until sampled)."""
    if isinstance(data, str | Path):
        return np.memmap(data, dtype=np.uint16, mode="r")
    return data


def batch_generator(seed: int, step: int, micro: int = 0) -> torch.Generator:
    """The random source of one batch: a pure function of (seed, step, micro-step)."""
    digest = hashlib.blake2b(f"{seed}:{step}:{micro}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest) & (2**63 - 1))


def get_batch(data: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows of `block_size` tokens (inputs) and the same shifted by one (targets)."""
    if len(data) <= block_size:
        raise ValueError(f"{len(data)} tokens are too few for windows of {block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator).tolist()
    windows = np.stack([np.asarray(data[i:i + block_size + 1], dtype=np.int64) for i in starts])
    x, y = (torch.from_numpy(np.ascontiguousarray(w)) for w in (windows[:, :-1], windows[:, 1:]))
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TokenData, *, batches: int = 20, batch_size: int = 8,
             block_size: int | None = None, seed: int = 0, dtype: str = "auto") -> float:
    """Mean loss over `batches` fixed batches of `data` (the same windows for every model, given the seed)."""
    tokens = load_tokens(data)
    gpt = unwrap(model)
    device = next(gpt.parameters()).device
    block = block_size or gpt.config.block_size
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        for i in range(batches):
            x, y = get_batch(tokens, batch_size, block, batch_generator(seed, i), device)
            with _autocast(device, dtype):
                _, loss = model(x, y)
            total += float(loss)  # type: ignore[arg-type]
    finally:
        model.train(was_training)
    return total / batches


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def train(model: GPT, train_data: TokenData, config: TrainConfig, *, val_data: TokenData | None = None,
          checkpoint_dir: Path | None = None, time_budget_s: float | None = None, progress: bool = True,
          on_log: Callable[[dict[str, float]], None] | None = None) -> TrainResult:
    """Train `model` in place (moved to the configured device) for `config.max_iters` optimizer steps.

    With `checkpoint_dir`, a resumable checkpoint (weights, optimizer, RNG, history) is written every
    `checkpoint_interval_s`, at the time budget and at the end, and a later call with the same
    configuration resumes from it. `time_budget_s` stops training cleanly (`finished=False`). Steps are
    reported as a progress stage; `progress` shows them on stderr where no progress display is active.
    """
    started = time.monotonic()
    device = resolve_device(config.device)
    tokens = load_tokens(train_data)
    block = config.block_size or model.config.block_size
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model.to(device)
    model.train()
    optimizer = model.configure_optimizer(config.weight_decay, config.learning_rate,
                                          (config.beta1, config.beta2), device.type)
    start_iter, history, elapsed_before = 0, [], 0.0
    torch.manual_seed(config.seed)
    saved_config = {"train_config": config.model_dump(mode="json")}
    if checkpoint_dir is not None and has_checkpoint(checkpoint_dir):
        ckpt = load_checkpoint(checkpoint_dir, device)
        if ckpt.meta.get("train_config") != saved_config["train_config"] or \
                ckpt.model.config != model.config or ckpt.train_state is None:
            raise ValueError(f"the checkpoint in {checkpoint_dir} is from a different configuration; "
                             "remove it to start again")
        model.load_state_dict(ckpt.model.state_dict())
        optimizer.load_state_dict(ckpt.train_state["optimizer"])
        start_iter, history = int(ckpt.train_state["iter"]), list(ckpt.train_state["history"])
        elapsed_before = float(ckpt.train_state["elapsed_s"])
        _set_rng_state(ckpt.train_state["rng"])
    runner = torch.compile(model) if config.compile and device.type == "cuda" else model

    def checkpoint(it: int) -> None:
        if checkpoint_dir is not None:
            state = {"iter": it, "history": history, "rng": _rng_state(),
                     "elapsed_s": elapsed_before + time.monotonic() - started}
            save_checkpoint(checkpoint_dir, model, optimizer=optimizer, train_state=state, meta=saved_config)

    def validate() -> float | None:
        if val_data is None:
            return None
        return evaluate(runner, val_data, batches=config.eval_batches, batch_size=config.batch_size,
                        block_size=block, seed=config.seed + 1, dtype=config.dtype)

    it, last_save, loss_value = start_iter, time.monotonic(), None
    finished = True
    with progress_display(progress), stage("training", total=config.max_iters, n=it) as steps:
        while it < config.max_iters:
            lr = learning_rate(it, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(config.grad_accum_steps):
                generator = batch_generator(config.seed, it, micro)
                x, y = get_batch(tokens, config.batch_size, block, generator, device)
                with _autocast(device, config.dtype):
                    _, loss = runner(x, y)
                loss = loss / config.grad_accum_steps  # type: ignore[operator]
                loss.backward()
                loss_sum += loss.detach()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            it += 1
            entry: dict[str, float] | None = None
            if it % config.log_interval == 0 or it == config.max_iters:
                loss_value = float(loss_sum)
                entry = {"iter": it, "lr": lr, "loss": loss_value}
            if val_data is not None and config.eval_interval and it % config.eval_interval == 0:
                entry = {**(entry or {"iter": it, "lr": lr}), "val_loss": validate()}  # type: ignore[dict-item]
            if entry is not None:
                history.append(entry)
                steps.update(what=f"training (loss {loss_value or float('nan'):.3f})")
                if on_log:
                    on_log(entry)
            steps.update(it)
            out_of_time = time_budget_s is not None and time.monotonic() - started >= time_budget_s
            if out_of_time or time.monotonic() - last_save >= config.checkpoint_interval_s:
                checkpoint(it)
                last_save = time.monotonic()
            if out_of_time and it < config.max_iters:
                finished = False
                break
    val_loss = None
    if finished:
        val_loss = next((h["val_loss"] for h in history if "val_loss" in h and h["iter"] == it), None)
        if val_loss is None and val_data is not None:
            val_loss = validate()
            history.append({"iter": it, "val_loss": val_loss})  # type: ignore[dict-item]
        checkpoint(it)
    return TrainResult(iters=it, finished=finished, train_loss=loss_value, val_loss=val_loss,
                       tokens_seen=it * config.grad_accum_steps * config.batch_size * block,
                       elapsed_s=elapsed_before + time.monotonic() - started, history=history)
