"""The settings of a restricted_mlm tier: the vocabulary and masking, how the scorer evaluates, and how
the asset builder trains the starting and the reference model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RestrictedMLMParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: Literal["mini", "full"] = Field(description="The corpus the models are trained and scored on.")
    vocab_size: int = Field(gt=0, description="Token ids the model sees, UNK and MASK included.")
    unk_id: int | None = Field(description=(
        "The id every token outside a compact vocabulary maps to; None: GPT-2's own vocabulary."))
    mask_id: int = Field(ge=0, description="The id of a masked position.")
    seq_len: int = Field(gt=0, description="Tokens per sequence.")
    mask_prob: float = Field(gt=0, lt=1, description="Share of the positions masked.")
    eval_batch_size: int = Field(gt=0, description="Sequences per held-out batch.")
    eval_batches: int = Field(gt=0, description="Held-out batches the scorer's loss is measured on.")
    setup_timeout_s: int = Field(gt=0, description=(
        "The longest loading the model and recording its forward pass may take."))
    max_graph_gb: float = Field(gt=0, description="The largest recorded graph (constants included).")
    torch_threads: int = Field(ge=0, description=(
        "Threads of the scorer's own computations (0: torch's choice)."))
    train_start: dict[str, Any] = Field(description="Flags of starting/train.py (--key=value) for the "
                                                    "starting model the asset builder trains.")
    train_reference: dict[str, Any] = Field(description=(
        "Flags of reference/train.py, read from reference/training.json (masked in sandboxes, as they "
        "describe the reference's architecture); empty where that file is unreadable."))
