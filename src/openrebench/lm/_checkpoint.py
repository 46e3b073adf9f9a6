"""Checkpoints: a folder with `config.json` (the GPTConfig and anything JSON the caller adds), the weights
(`model.safetensors`, or `model.pt` where safetensors is missing) and, for training, `train_state.pt`
(optimizer and RNG state). Nothing is unpickled: torch files load with `weights_only=True`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ._model import GPT, GPTConfig

TIED = "lm_head.weight"  # the same tensor as transformer.wte.weight: stored once


def _safetensors_available() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


def unwrap(model: torch.nn.Module) -> GPT:
    """The GPT under a torch.compile wrapper (whose state dict names carry an `_orig_mod.` prefix)."""
    inner = getattr(model, "_orig_mod", model)
    if not isinstance(inner, GPT):
        raise TypeError(f"expected a GPT, got {type(inner).__name__}")
    return inner


def save_checkpoint(folder: Path, model: torch.nn.Module, *, optimizer: torch.optim.Optimizer | None = None,
                    train_state: dict[str, Any] | None = None, meta: dict[str, Any] | None = None,
                    use_safetensors: bool | None = None) -> Path:
    """Write a checkpoint folder atomically (a reader sees the old one or the new one, never half)."""
    gpt = unwrap(model)
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().contiguous() for k, v in gpt.state_dict().items() if k != TIED}
    if use_safetensors is None:
        use_safetensors = _safetensors_available()
    if use_safetensors:
        from safetensors.torch import save_file

        save_file(weights, tmp / "model.safetensors")
    else:
        torch.save(weights, tmp / "model.pt")
    config = {"model_config": gpt.config.model_dump(), **(meta or {})}
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if optimizer is not None or train_state is not None:
        state = dict(train_state or {})
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        torch.save(state, tmp / "train_state.pt")
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


@dataclass
class Checkpoint:
    model: GPT
    meta: dict[str, Any] = field(default_factory=dict)
    train_state: dict[str, Any] | None = None


def _existing(folder: Path) -> Path:
    """The checkpoint itself, or the previous one if a save was interrupted between its two renames."""
    old = folder.with_name(folder.name + ".old")
    if not (folder / "config.json").is_file() and (old / "config.json").is_file():
        return old
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint in {folder}")
    return folder


def has_checkpoint(folder: Path) -> bool:
    try:
        _existing(Path(folder))
    except FileNotFoundError:
        return False
    return True


def load_checkpoint(folder: Path, device: str | torch.device = "cpu", *,
                    train_state: bool = True) -> Checkpoint:
    folder = _existing(Path(folder))
    meta = json.loads((folder / "config.json").read_text())
    config = GPTConfig.model_validate(meta.pop("model_config"))
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        weights = load_file(folder / "model.safetensors", device=str(device))
    else:
        weights = torch.load(folder / "model.pt", map_location=device, weights_only=True)
    model = GPT(config).to(device)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if set(missing) - {TIED} or unexpected:
        raise ValueError(f"checkpoint {folder} does not fit its config: missing {missing}, "
                         f"unexpected {unexpected}")
    state = None
    if train_state and (folder / "train_state.pt").is_file():
        state = torch.load(folder / "train_state.pt", map_location="cpu", weights_only=True)
    return Checkpoint(model=model, meta=meta, train_state=state)


def load_model(folder: Path, device: str | torch.device = "cpu") -> GPT:
    return load_checkpoint(folder, device, train_state=False).model
