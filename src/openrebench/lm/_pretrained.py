"""Trained models as cached assets: train once (resumably, within a time budget), reuse everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openrebench.api import (
    BuildIncomplete,
    Deadline,
    Manifest,
    OnMismatch,
    assets_root,
    cached_build,
    progress_display,
    stage,
)

from ._checkpoint import load_model, save_checkpoint
from ._corpus import Corpus
from ._model import GPT, GPTConfig
from ._train import TrainConfig, evaluate, train

BUILDER_VERSION = "1"
# settings that change how fast a model trains, not which model comes out
_NOT_IDENTITY = {"device", "compile", "log_interval", "checkpoint_interval_s"}


@dataclass(frozen=True)
class TrainedModel:
    path: Path  # a checkpoint folder: load_model(path)
    manifest: Manifest

    def load(self, device: str | torch.device = "cpu") -> GPT:
        return load_model(self.path, device)


def build_trained_model(name: str, model_config: GPTConfig, train_config: TrainConfig, corpus: Corpus, *,
                        cache_dir: Path | None = None, time_budget_s: float | None = None,
                        progress: bool = True, on_mismatch: OnMismatch = "rebuild",
                        label: str | None = None) -> TrainedModel:
    """Train a GPT on `corpus` into `<cache>/lm/model-<name>` (or reuse it), with losses in the manifest.

    Training checkpoints every `train_config.checkpoint_interval_s`; a build stopped by its time budget
    raises `BuildIncomplete`, and the next call resumes from the last checkpoint. The build is a progress
    stage named `label` (default: the model's name); `progress` shows it where no display is active.
    """
    folder = assets_root(cache_dir) / f"model-{name}"
    params: dict[str, Any] = {
        "model_config": model_config.model_dump(),
        "train_config": train_config.model_dump(mode="json", exclude=_NOT_IDENTITY),
        "corpus": {"what": corpus.manifest.what, "seed": corpus.manifest.seed,
                   "train_sha256": corpus.manifest.files["train.bin"].sha256},
    }

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        torch.manual_seed(train_config.seed)
        model = GPT(model_config)
        result = train(model, corpus.bin_path("train"), train_config, val_data=corpus.bin_path("val"),
                       checkpoint_dir=partial / "work" / "checkpoint", time_budget_s=deadline.remaining_s,
                       progress=progress)
        if not result.finished:
            raise BuildIncomplete(f"model {name}", deadline.budget_s or 0.0,
                                  f"{result.iters} of {train_config.max_iters} steps, checkpoint saved")
        with stage("held-out loss"):
            heldout = evaluate(model, corpus.bin_path("heldout"), batches=train_config.eval_batches,
                               batch_size=train_config.batch_size, block_size=train_config.block_size,
                               seed=train_config.seed + 2, dtype=train_config.dtype)
        save_checkpoint(partial / "model", model.cpu(), meta={"name": name})
        stats = {"iters": result.iters, "train_loss": result.train_loss, "val_loss": result.val_loss,
                 "heldout_loss": heldout, "tokens_seen": result.tokens_seen, "params": model.num_params(),
                 "train_seconds": round(result.elapsed_s, 3)}
        return {"corpus": str(corpus.path)}, stats

    with progress_display(progress):
        manifest = cached_build(folder, what=f"model:{name}", builder_version=BUILDER_VERSION,
                                seed=train_config.seed, params=params, build=build,
                                time_budget_s=time_budget_s, on_mismatch=on_mismatch,
                                label=label or f"model {name}")
    return TrainedModel(folder / "model", manifest)
