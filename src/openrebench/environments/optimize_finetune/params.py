"""The settings of an optimize_finetune tier: the model, the records, the starting finetune.yaml, and
how the scorer times and checks a run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPT2Shape(_Frozen):
    """The finetuned model: GPT-2's architecture at the tier's size."""

    n_layer: int = Field(gt=0)
    n_embd: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_positions: int = Field(gt=0, description="Longest context.")


class RecordsData(_Frozen):
    """The prompt/response records the asset builder cuts from a corpus's training text."""

    corpus: Literal["mini", "full"]
    seed: int
    pool_records: int = Field(gt=0, description="Records the scorer samples each scoring's data from.")
    example_records: int = Field(gt=0, description="Records of the agent's own finetune_data.jsonl.")
    min_tokens: int = Field(gt=0, description="Shortest record (prompt and response).")
    max_tokens: int = Field(gt=0, description="Longest record.")


class FinetuneConfig(_Frozen):
    """The values filled into starting/finetune.yaml (written as they appear there)."""

    max_seq_len: int = Field(gt=0)
    num_proc: int = Field(gt=0, description="Tokenising processes.")
    num_workers: int = Field(ge=0, description="Data loader workers.")
    global_train_batch_size: int = Field(gt=0, description="Records per optimizer step, over all GPUs.")
    device_train_microbatch_size: int = Field(gt=0, description="Records per forward/backward pass.")
    device_eval_batch_size: int = Field(gt=0)
    precision: Literal["fp32", "amp_bf16"]
    lr: str = Field(description="The learning rate as written in the YAML ('1.0e-3').")
    t_warmup: str = Field(description="Warm-up in Composer's units ('2ba': two batches).")
    output_precision: Literal["fp32", "bf16"]


class FinetuneParams(_Frozen):
    model: GPT2Shape
    init_seed: int = Field(description="Seed of the initial (randomly initialised) weights.")
    init_precision: Literal["fp32", "bf16"] = Field(description="The initial weights' dtype.")
    data: RecordsData
    records: int = Field(gt=0, description="Records each scoring's run finetunes on (a fresh sample).")
    config: FinetuneConfig
    run_timeout_s: int = Field(gt=0, description="The longest the agent's finetune.sh may run.")
    reference_timeout_s: int = Field(gt=0, description="The longest the scorer's reference run may take.")
    max_relative_l1: float = Field(gt=0, description=(
        "Tolerance: L1 distance to the reference run's weights over the reference run's own change."))
    min_update_share: float = Field(gt=0, le=1, description=(
        "The least the weights must move from the initial ones, as a share of the reference run's change."))
    threads: int | None = Field(default=None, description="OMP_NUM_THREADS for the runs (None: unset).")
    reference_run_s: float | None = Field(default=None, description=(
        "The reference run's median time at calibration: the solution's time is scaled by this over the "
        "scoring's own reference run's time (None: plain seconds)."))
