"""The settings of a fix_embedding tier: the two models, how the asset builder trains them, and how the
scorer measures the held-out loss. Plain pydantic, so that the environment is listed without importing
torch; the asset builder turns them into `openrebench.lm` configs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelCommon(_Frozen):
    """What the large and the small GPT share (fields of `openrebench.lm.GPTConfig`)."""

    block_size: int = Field(gt=0, description="Context length in tokens.")
    vocab_size: int = Field(gt=0, description="The tier's vocabulary (a compact one below GPT-2's).")
    dropout: float = Field(ge=0, lt=1)


class ModelShape(_Frozen):
    """The size of one of the two GPTs (fields of `openrebench.lm.GPTConfig`)."""

    n_layer: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_embd: int = Field(gt=0)


class Training(_Frozen):
    """How the asset builder trains a model: the fields of `openrebench.lm.TrainConfig` the tier sets (the
    others keep TrainConfig's defaults)."""

    max_iters: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    learning_rate: float = Field(gt=0)
    warmup_iters: int = Field(ge=0)
    device: Literal["cpu", "cuda"]
    compile: bool = False
    eval_batches: int = Field(gt=0)
    checkpoint_interval_s: float = Field(gt=0)
    seed: int


class FixEmbeddingParams(_Frozen):
    corpus: Literal["mini", "full"] = Field(description="The corpus the models are trained and scored on.")
    model_common: ModelCommon
    large: ModelShape = Field(description="The model whose embedding is permuted: the one to fix.")
    small: ModelShape = Field(description="The correctly trained smaller model given alongside.")
    train_large: Training
    train_small: Training
    reference_permutation_seed: int = Field(description=(
        "The permutation of the reference fix's own model only; each run's model gets a fresh secret one."))
    reference: dict[str, Any] = Field(description=(
        "Keyword arguments of reference/fix.py's fix(), read from reference/settings.json (masked in "
        "sandboxes, as they describe how the reference works); empty where that file is unreadable."))
    output_dir: str = Field(description="Where in the workspace the agent saves its fixed model.")
    eval_batches: int = Field(gt=0, description="Held-out batches the scorer's loss is measured on.")
    eval_batch_size: int = Field(gt=0)
    eval_seed: int = Field(description="Which held-out windows the scorer draws (the same every scoring).")
