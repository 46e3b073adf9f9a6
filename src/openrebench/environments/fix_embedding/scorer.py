"""Scoring fix_embedding: load the agent's weights (no agent code runs), check the architecture,
measure the loss on held-out tokens the agent never sees. Score ln(loss - 1.5), lower is better.
Messages about the held-out evaluation are fixed texts: nothing of the held-out tokens reaches the agent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from openrebench.api import ScoreResult, TierSpec
from openrebench.lm import GPT, GPTConfig, evaluate

from .params import FixEmbeddingParams

TIED = "lm_head.weight"
HELDOUT_FAILURE = "Invalid: evaluating the model on the held-out text failed."


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The agent's weights, read without unpickling arbitrary objects."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "model.pt").is_file():
        return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors (or model.pt) in {folder.name}/")


def check_architecture(weights: dict[str, torch.Tensor], expected: GPT) -> str | None:
    """Why `weights` do not fit the expected model exactly, or None."""
    want = {k: v.shape for k, v in expected.state_dict().items() if k != TIED}
    got = {k: getattr(v, "shape", None) for k, v in weights.items() if k != TIED}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        return f"parameters differ from the model's: missing {missing[:5]}, unexpected {extra[:5]}"
    for k, shape in want.items():
        if got[k] != shape:
            return f"{k} has shape {tuple(got[k] or ())}, expected {tuple(shape)}"
        if not torch.is_floating_point(weights[k]):
            return f"{k} is not a floating-point tensor"
        if not torch.isfinite(weights[k]).all():
            return f"{k} has NaN or infinite values"
    return None


def score(spec: TierSpec[FixEmbeddingParams], solution: Path, protected: Path) -> ScoreResult:
    p = spec.params
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = GPTConfig.model_validate(json.loads((protected / "model_config.json").read_text()))
    model = GPT(config)
    folder = solution / p.output_dir
    try:
        weights = load_weights(folder)
    except FileNotFoundError as e:
        return ScoreResult.invalid(f"Invalid: {e}; save your model to {p.output_dir}/.")
    except Exception as e:  # a corrupt or foreign file
        return ScoreResult.invalid(f"Invalid: could not read the weights in {p.output_dir}/ "
                                   f"({type(e).__name__}: {str(e)[:200]}).")
    problem = check_architecture(weights, model)
    if problem:
        return ScoreResult.invalid(f"Invalid: the model must keep the original architecture: {problem}.")
    model.load_state_dict({k: v.float() for k, v in weights.items() if k != TIED}, strict=False)
    device = "cuda" if spec.device == "cuda" and torch.cuda.is_available() else "cpu"
    model.to(device)
    try:
        loss = evaluate(model, protected / "heldout.bin", batches=p.eval_batches,
                        batch_size=p.eval_batch_size, block_size=config.block_size, seed=p.eval_seed)
    except Exception as e:  # a fixed description only: the error's text could quote held-out tokens
        return ScoreResult.invalid(HELDOUT_FAILURE, error_type=type(e).__name__)
    if not math.isfinite(loss):
        return ScoreResult.invalid("Invalid: the held-out loss is not finite.")
    raw = math.log(max(loss - 1.5, 1e-6))
    return ScoreResult(raw=raw, message=f"Valid: held-out loss {loss:.4f}; score ln(loss - 1.5) = {raw:.4f}",
                       details={"loss": loss, "eval_tokens": p.eval_batches * p.eval_batch_size
                                * config.block_size})
