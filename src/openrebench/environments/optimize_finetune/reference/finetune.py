"""The whole finetuning pipeline in one process, computing what the three-stage finetune.sh computes.

What changed, and why the weights stay the same up to floating-point noise:
- one process: tokenising, training and saving share one interpreter and one model load;
- tokens stay in memory; micro-batches are padded to their own longest sequence, not max_seq_len
  (padding is masked out of attention and loss, so it changes nothing but the work);
- the output layer runs on the positions that have a label only;
- on one device, each step's records are sorted by length and packed into passes of up to
  `pass_tokens` padded tokens (8,192 per 64 GB of GPU memory); every labelled token carries the
  weight it had in train.py's loss (its micro-batch's share of the records over that micro-batch's
  labelled tokens), so the gradient is the same sum, with far less padding and fewer, larger passes
  (HF GPT-2 in eager PyTorch is bound by kernel launches: fewer passes, less Python per token);
- padded widths are rounded up to a multiple of 64 (fewer distinct shapes for cuDNN and cuBLAS to
  plan for), TF32 for what autocast leaves in fp32, and the weights travel to the GPU in the dtype
  they are stored in before becoming fp32 (bf16 to fp32 is exact);
- fused attention (`sdpa` unless the config asks for flash_attention_2) and, on GPUs, fused AdamW;
- no evaluation and no training checkpoint: the weights go from memory to trained_model/ directly.
The seed, the data order, the batch and micro-batch split, the loss weighting, the optimizer, the
schedule and the clipping are those of train.py; most options of finetune.yaml keep working.

    python finetune.py finetune.yaml
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

IGNORE = -100
PASS_TOKENS = 8192  # padded tokens per forward/backward pass, per 64 GB of GPU memory (memory, not maths)
WIDTH_MULTIPLE = 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tokenize(cfg: dict[str, Any], tokenizer: Any) -> list[tuple[list[int], int]]:
    """(ids, prompt length) per record: prompt ids + response ids + <eos>, cut to max_seq_len."""
    data = cfg["data"]
    with open(data["path"]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    prompts = tokenizer([r[data.get("prompt_key", "prompt")] for r in records],
                        add_special_tokens=False)["input_ids"]
    responses = tokenizer([r[data.get("response_key", "response")] for r in records],
                          add_special_tokens=False)["input_ids"]
    samples = []
    for prompt, response in zip(prompts, responses, strict=True):
        ids = (prompt + response + [tokenizer.eos_token_id])[: cfg["max_seq_len"]]
        if len(prompt) >= len(ids):
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no response within max_seq_len")
        samples.append((ids, len(prompt)))
    return samples


def collate(samples: list[tuple[list[int], int]], pad_id: int, multiple: int = 1,
            limit: int | None = None) -> dict[str, torch.Tensor]:
    """Padded input ids, attention mask and labels; the width is the longest record rounded up to
    `multiple` (at most `limit`)."""
    longest = max(len(ids) for ids, _ in samples)
    width = -(-longest // multiple) * multiple
    if limit is not None:
        width = max(longest, min(width, limit))
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    labels = torch.full((len(samples), width), IGNORE, dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(samples):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention_mask[row, :len(ids)] = 1
        labels[row, prompt_length:len(ids)] = input_ids[row, prompt_length:len(ids)]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def global_batches(n: int, global_batch: int, seed: int, epoch: int, shuffle: bool,
                   drop_last: bool) -> list[list[int]]:
    """The same permutation and global batches as train.py's GlobalBatchSampler."""
    order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)) if shuffle
             else torch.arange(n)).tolist()
    batches = [order[i:i + global_batch] for i in range(0, n, global_batch)]
    if drop_last and batches and len(batches[-1]) < global_batch:
        batches.pop()
    return batches


def parse_duration(text: str | int, steps_per_epoch: int) -> int:
    text = str(text).strip()
    if text.endswith("ep"):
        return int(float(text[:-2]) * steps_per_epoch)
    if text.endswith("ba"):
        return int(text[:-2])
    return int(text)


def lr_factor(cfg: dict[str, Any], total_steps: int, steps_per_epoch: int):  # type: ignore[no-untyped-def]
    name = cfg.get("name", "cosine_with_warmup")
    warmup = parse_duration(cfg.get("t_warmup", "0ba"), steps_per_epoch)
    alpha_f = float(cfg.get("alpha_f", 0.0))
    if name not in ("cosine_with_warmup", "linear_decay_with_warmup", "constant_with_warmup"):
        raise ValueError(f"unknown scheduler {name!r}")

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if name == "constant_with_warmup":
            return 1.0
        tau = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if name == "cosine_with_warmup":
            return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * tau))
        return 1.0 + (alpha_f - 1.0) * tau

    return factor


def record_weights(batch: list[int], samples: list[tuple[list[int], int]], micro: int) -> dict[int, float]:
    """train.py's step loss is sum over micro-batches m of (records in m / records in the batch) times
    the mean loss over m's labelled tokens: the weight of each labelled token, per record."""
    weight = {}
    for lo in range(0, len(batch), micro):
        members = batch[lo:lo + micro]
        labelled = sum(len(samples[i][0]) - samples[i][1] for i in members)
        for i in members:
            weight[i] = len(members) / len(batch) / labelled
    return weight


def pass_budget(device: torch.device) -> int:
    """Padded tokens per pass: PASS_TOKENS per 64 GB of GPU memory (at least PASS_TOKENS)."""
    memory_gb = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else 0
    return PASS_TOKENS * max(1, int(memory_gb // 64))


def weighted_passes(batch: list[int], samples: list[tuple[list[int], int]], micro: int,
                    budget: int = PASS_TOKENS) -> list[tuple[list[int], list[float]]]:
    """The records sorted by length and packed into passes of at most `budget` padded tokens, each with
    its tokens' weight (`record_weights`): (records, weights) per pass."""
    weight = record_weights(batch, samples, micro)
    passes: list[tuple[list[int], list[float]]] = []
    current: list[int] = []
    for i in sorted(batch, key=lambda i: len(samples[i][0])):
        if current and (len(current) + 1) * len(samples[i][0]) > budget:
            passes.append((current, [weight[j] for j in current]))
            current = []
        current.append(i)
    passes.append((current, [weight[j] for j in current]))
    return passes


def weighted_loss(model: Any, batch: dict[str, torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Sum over labelled tokens of the token's loss times its record's weight (output layer on those
    tokens only)."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              use_cache=False)[0]
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE
    per_row = torch.tensor(weights, device=targets.device).unsqueeze(1).expand_as(targets)
    losses = F.cross_entropy(model.get_output_embeddings()(hidden[:, :-1][keep]).float(), targets[keep],
                             reduction="none")
    return (losses * per_row[keep]).sum()


def distribute(model: torch.nn.Module, cfg: dict[str, Any], device: torch.device,
               world: int) -> torch.nn.Module:
    """FSDP over several GPUs (DDP over several CPU processes, where FSDP cannot run); else the model."""
    model.to(device)
    if world == 1:
        return model
    if device.type != "cuda":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    blocks = {type(m) for m in model.modules() if type(m).__name__ in (model._no_split_modules or [])}
    strategy = cfg.get("fsdp", {}).get("sharding_strategy", "FULL_SHARD")
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(blocks) if blocks else None,
                sharding_strategy=ShardingStrategy[strategy], device_id=device, use_orig_params=True)


def main() -> None:
    config_path = sys.argv[1] if len(sys.argv) > 1 else "finetune.yaml"
    cfg = yaml.safe_load(Path(config_path).read_text())
    gpus = torch.cuda.device_count()
    if gpus > 1 and "WORLD_SIZE" not in os.environ:  # one process per GPU, started from here
        os.execvp("torchrun", ["torchrun", "--standalone", f"--nproc_per_node={gpus}", __file__, config_path])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    seed = int(cfg["seed"])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    started = time.time()

    tokenizer = AutoTokenizer.from_pretrained(cfg["tokenizer"]["name"])
    samples = tokenize(cfg, tokenizer)
    attention = cfg["model"].get("attn_implementation", "eager")
    model = AutoModelForCausalLM.from_pretrained(
        cfg["model"]["pretrained_model_name_or_path"], dtype="auto",
        attn_implementation="flash_attention_2" if attention == "flash_attention_2" else "sdpa")
    model = distribute(model.to(device).float(), cfg, device, world)

    opt = cfg["optimizer"]
    if opt.get("name", "adamw") != "adamw":
        raise ValueError(f"unsupported optimizer {opt['name']!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(opt["lr"]), betas=tuple(opt["betas"]),
                                  eps=float(opt["eps"]), weight_decay=float(opt["weight_decay"]),
                                  fused=device.type == "cuda")
    loader = cfg.get("train_loader", {})
    batching = {"n": len(samples), "global_batch": int(cfg["global_train_batch_size"]), "seed": seed,
                "shuffle": loader.get("shuffle", True), "drop_last": loader.get("drop_last", True)}
    steps_per_epoch = len(global_batches(epoch=0, **batching))
    total_steps = parse_duration(cfg["max_duration"], steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  lr_factor(cfg["scheduler"], total_steps, steps_per_epoch))
    micro = int(cfg["device_train_microbatch_size"])
    clip = float(cfg.get("gradient_clipping", {}).get("norm", 0.0))
    precision = cfg.get("precision", "fp32")
    if precision not in ("fp32", "amp_bf16"):
        raise ValueError(f"unsupported precision {precision!r} (fp32 or amp_bf16)")
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "amp_bf16")
    pad_id = tokenizer.eos_token_id
    pass_tokens = pass_budget(device)
    max_seq_len = int(cfg["max_seq_len"])

    step, epoch = 0, 0
    model.train()
    while step < total_steps:
        for batch in global_batches(epoch=epoch, **batching):
            share = math.ceil(len(batch) / world)
            mine = batch[rank * share:(rank + 1) * share]
            optimizer.zero_grad(set_to_none=True)
            if world == 1:
                for members, weights in weighted_passes(mine, samples, micro, pass_tokens):
                    part = collate([samples[i] for i in members], pad_id, WIDTH_MULTIPLE, max_seq_len)
                    part = {k: v.to(device, non_blocking=True) for k, v in part.items()}
                    with amp:
                        loss = weighted_loss(model, part, weights)
                    loss.backward()
            else:
                for lo in range(0, len(mine), micro):
                    part = {k: v.to(device, non_blocking=True)
                            for k, v in collate([samples[i] for i in mine[lo:lo + micro]], pad_id).items()}
                    with amp:
                        loss = model(**part).loss
                    (loss * (part["input_ids"].shape[0] / len(batch)) * world).backward()
            if clip > 0:
                if hasattr(model, "clip_grad_norm_"):  # FSDP: the norm over every rank's shard
                    model.clip_grad_norm_(clip)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()
            step += 1
            if step >= total_steps:
                break
        epoch += 1

    save(model, cfg, tokenizer, world, rank)
    if rank == 0:
        print(f"finetuned for {step} steps and saved trained_model/ in {time.time() - started:.1f} s")
    if world > 1:
        dist.destroy_process_group()


def save(model: Any, cfg: dict[str, Any], tokenizer: Any, world: int, rank: int) -> None:
    """The weights, straight from memory, in the configured precision, as a Hugging Face folder."""
    dtype = DTYPES[cfg.get("output_precision", "fp32")]
    state, inner = None, model
    if world > 1:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        inner = model.module
        if isinstance(model, FSDP):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                      FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
                state = model.state_dict()
    if rank == 0:
        if state is None:
            inner.to(dtype).save_pretrained("trained_model")
        else:
            inner.save_pretrained("trained_model", state_dict={k: v.to(dtype) for k, v in state.items()})
        tokenizer.save_pretrained("trained_model")


if __name__ == "__main__":
    main()
