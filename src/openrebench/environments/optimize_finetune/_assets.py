"""Assets of optimize_finetune: the initial model (a GPT-2 architecture initialised from a seed), the
tokenizer files, and the prompt/response records (a pool for the scorer and an example for the agent),
all deterministic and cached under `<cache>/lm/` with manifests."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.api import TierSpec, stage
from openrebench.lm import (
    Deadline,
    assets_root,
    build_corpus,
    cached_build,
    gpt2_tokenizer,
    gpt2_tokenizer_dir,
)

from .params import FinetuneParams

BUILDER_VERSION = "1"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
VOCAB_SIZE = 50257
EOS = 50256


@dataclass(frozen=True)
class Assets:
    initial_model: Path  # a Hugging Face model folder
    tokenizer: Path  # GPT-2 tokenizer files (vocab.json, merges.txt, ...)
    pool: Path  # JSON lines: the records the scorer draws from
    example: Path  # JSON lines: the agent's finetune_data.jsonl


def gpt2_config(spec: TierSpec[FinetuneParams]) -> Any:
    """The tier's model: GPT-2's architecture at the tier's size, without dropout (so that a run depends
    only on the data and its order)."""
    from transformers import GPT2Config

    m = spec.params.model
    return GPT2Config(vocab_size=VOCAB_SIZE, n_positions=m.n_positions, n_embd=m.n_embd,
                      n_layer=m.n_layer, n_head=m.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=EOS, eos_token_id=EOS)


def _initial_model(spec: TierSpec[FinetuneParams], cache_dir: Path) -> Path:
    folder = assets_root(cache_dir) / f"finetune-{spec.name}-initial"
    p = spec.params

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        with stage("loading transformers"):  # seconds of imports on a busy CPU
            import torch
            from transformers import GPT2LMHeadModel
            from transformers.utils import logging

        logging.disable_progress_bar()
        torch.manual_seed(p.init_seed)
        with stage("initialising"):
            model = GPT2LMHeadModel(gpt2_config(spec))
            model.to({"fp32": torch.float32, "bf16": torch.bfloat16}[p.init_precision])
        with stage("saving"):
            model.save_pretrained(partial / "model")
        return {}, {"params": sum(t.numel() for t in model.parameters())}

    cached_build(folder, what=f"model:finetune-{spec.name}-initial", builder_version=BUILDER_VERSION,
                 seed=p.init_seed, params={"model": p.model.model_dump(), "precision": p.init_precision},
                 build=build, label=f"optimize_finetune {spec.name}: initial weights")
    return folder / "model"


def _records(spec: TierSpec[FinetuneParams], cache_dir: Path) -> Path:
    """Passages of the mini corpus's training text cut into a prompt and its continuation. Lengths in
    tokens are skewed towards short ones (min + (max - min) * u^2), as finetuning sets usually are."""
    folder = assets_root(cache_dir) / f"finetune-{spec.name}-data"
    d = spec.params.data

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        corpus = build_corpus(d.corpus, cache_dir, progress=False)
        tokens = corpus.tokens("train")
        enc = gpt2_tokenizer(cache_dir)
        rng = random.Random(d.seed)
        count = d.pool_records + d.example_records
        records, total = [], 0
        while len(records) < count:
            length = d.min_tokens + int((d.max_tokens - d.min_tokens) * rng.random() ** 2)
            start = rng.randrange(0, len(tokens) - length)
            window = [int(t) for t in tokens[start:start + length]]
            if EOS in window:  # keep each passage within one document
                continue
            cut = max(1, int(length * rng.uniform(0.2, 0.5)))
            records.append({"prompt": enc.decode(window[:cut]), "response": enc.decode(window[cut:])})
            total += length
        with open(partial / "pool.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[:d.pool_records])
        with open(partial / "example.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[d.pool_records:])
        return {"corpus": corpus.manifest.key()}, {"records": len(records), "approx_tokens": total}

    cached_build(folder, what=f"data:finetune-{spec.name}", builder_version=BUILDER_VERSION, seed=d.seed,
                 params=d.model_dump(), build=build,
                 label=f"optimize_finetune {spec.name}: prompt and response records")
    return folder


def build(spec: TierSpec[FinetuneParams], cache_dir: Path) -> Assets:
    data = _records(spec, cache_dir)
    return Assets(initial_model=_initial_model(spec, cache_dir), tokenizer=gpt2_tokenizer_dir(cache_dir),
                  pool=data / "pool.jsonl", example=data / "example.jsonl")
