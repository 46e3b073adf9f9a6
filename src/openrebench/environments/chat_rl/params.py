"""The settings of a chat_rl tier: which base model and data, how the SFT reference and the scorer's
answers are made, and the sizes of the starting and reference pipelines."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Pipeline(BaseModel):
    """One RL pipeline (rl_finetune.py): rounds of sampling answers, asking the judge, finetuning on the
    winners."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompts: int = Field(gt=0, description="Training prompts per round.")
    samples: int = Field(ge=2, description="Answers sampled per prompt (2: a pair; 8: a tournament).")
    rounds: int = Field(default=1, gt=0)
    steps: int = Field(gt=0, description="Finetuning steps per round.")
    learning_rate: float = Field(gt=0)
    mask_prompt: bool = Field(description="Whether the finetuning loss skips the prompt's tokens.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature of the answers.")


class ChatRLParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data: Literal["dictionary", "alpaca"] = Field(
        description=(
            "dictionary: instructions made from GCIDE and the chatterbot corpus (offline); alpaca: Stanford "
            "Alpaca through Hugging Face datasets."
        )
    )
    corpus: Literal["dictionary", "full"] = Field(description="What a base model trained here reads.")
    base_hub: str | None = Field(
        default=None,
        description=(
            "A Hugging Face GPT-2 to take as the base model where the Hub is reachable (the paper's "
            "GPT-2 XL); else a GPT of the shape below is trained on `corpus`."
        ),
    )
    vocab_size: int = Field(description="The model's vocabulary: GPT-2's 50257, or a compact one.")
    n_layer: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_embd: int = Field(gt=0)
    block_size: int = Field(gt=0, description="Context in tokens: an Alpaca prompt and its answer fit.")
    base_iters: int = Field(gt=0, description="Pretraining steps of a base model trained here.")
    base_batch: int = Field(gt=0)
    base_lr: float = Field(gt=0)
    device: str = Field(description="Where models train and answer: cpu, cuda.")
    n_train_prompts: int = Field(gt=0, description="Instructions in the agent's prompts.jsonl.")
    n_sft: int = Field(gt=0, description="Demonstrations the SFT reference model is finetuned on.")
    n_heldout: int = Field(gt=0, description="Held-out instructions per scoring.")
    sft_steps: int = Field(gt=0)
    sft_batch: int = Field(gt=0)
    sft_lr: float = Field(gt=0)
    max_new_tokens: int = Field(gt=0, description="Tokens an answer may have (paper: 60).")
    temperature: float = Field(gt=0, description="The scorer's sampling temperature (fixed).")
    top_k: int = Field(gt=0, description="The scorer's top-k (fixed).")
    judge_method: Literal["likelihood", "prompted"] = Field(
        description=(
            "likelihood: a base-model judge's log-probabilities; prompted: a chat judge names the better."
        )
    )
    judge_workers: int = Field(default=8, gt=0, description="Judge requests at once.")
    probe_steps: int = Field(default=300, gt=0, description=(
        "Finetuning steps that teach the base model a probe's policy (an answer that ignores the question: "
        "`openrebench calibrate` scores these beside the start and the reference)."))
    start: Pipeline
    reference: Pipeline
    base_model: str = Field(description="The base model, in words (for the instructions).")
