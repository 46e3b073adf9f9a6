"""Stage 2 of finetune.sh: finetune a causal language model on the token shards; save a full checkpoint.

One process per GPU (`torchrun`), FSDP over several GPUs, plain PyTorch on one device. Every step
takes one global batch of `global_train_batch_size` records (a seeded permutation, the same on any
number of GPUs), runs it in micro-batches of `device_train_microbatch_size`, weighs each micro-batch's
mean token loss by its share of the global batch, clips the gradient norm and steps AdamW.

    python train.py finetune.yaml --data tokens --save-folder ftout
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

IGNORE = -100


class TokenDataset(Dataset):
    """The samples of a folder of token shards: (ids, prompt length)."""

    def __init__(self, folder: Path) -> None:
        index = json.loads((folder / "index.json").read_text())
        self.samples: list[tuple[np.ndarray, int]] = []
        for shard in index["shards"]:
            data = np.load(folder / shard)
            tokens, offsets = data["tokens"], data["offsets"]
            for i, prompt_length in enumerate(data["prompt_lengths"]):
                self.samples.append((tokens[offsets[i]:offsets[i + 1]], int(prompt_length)))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids, prompt_length = self.samples[i]
        return {"input_ids": torch.from_numpy(ids.astype(np.int64)), "prompt_length": prompt_length}


class Collator:
    """Right-pads a list of samples; labels are the tokens after the prompt (-100 elsewhere)."""

    def __init__(self, pad_id: int, pad_to: int | None) -> None:
        self.pad_id, self.pad_to = pad_id, pad_to

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = self.pad_to or max(len(s["input_ids"]) for s in samples)
        input_ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
        labels = torch.full((len(samples), width), IGNORE, dtype=torch.long)
        for row, s in enumerate(samples):
            n = len(s["input_ids"])
            input_ids[row, :n] = s["input_ids"]
            attention_mask[row, :n] = 1
            labels[row, s["prompt_length"]:n] = s["input_ids"][s["prompt_length"]:]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class GlobalBatchSampler:
    """Global batches from a permutation seeded by (seed, epoch); each rank takes its contiguous share."""

    def __init__(self, n: int, global_batch: int, seed: int, epoch: int, rank: int, world: int,
                 shuffle: bool, drop_last: bool) -> None:
        self.n, self.global_batch, self.seed, self.epoch = n, global_batch, seed, epoch
        self.rank, self.world, self.shuffle, self.drop_last = rank, world, shuffle, drop_last

    def batches(self) -> list[list[int]]:
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.n)
        order_list = order.tolist()
        batches = [order_list[i:i + self.global_batch] for i in range(0, self.n, self.global_batch)]
        if self.drop_last and batches and len(batches[-1]) < self.global_batch:
            batches.pop()
        return batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in self.batches():
            share = math.ceil(len(batch) / self.world)
            yield batch[self.rank * share:(self.rank + 1) * share]

    def __len__(self) -> int:
        return len(self.batches())


def parse_duration(text: str | int, steps_per_epoch: int) -> int:
    """'2ep' or '100ba' (or a plain number of steps) -> optimizer steps."""
    text = str(text).strip()
    if text.endswith("ep"):
        return int(float(text[:-2]) * steps_per_epoch)
    if text.endswith("ba"):
        return int(text[:-2])
    return int(text)


def lr_lambda(cfg: dict[str, Any], total_steps: int, steps_per_epoch: int):  # type: ignore[no-untyped-def]
    """The learning-rate multiplier after `step` optimizer steps (composer's schedulers)."""
    name = cfg.get("name", "cosine_with_warmup")
    warmup = parse_duration(cfg.get("t_warmup", "0ba"), steps_per_epoch)
    alpha_f = float(cfg.get("alpha_f", 0.0))

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if name == "constant_with_warmup":
            return 1.0
        tau = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if name == "cosine_with_warmup":
            return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * tau))
        if name == "linear_decay_with_warmup":
            return 1.0 + (alpha_f - 1.0) * tau
        raise ValueError(f"unknown scheduler {name!r}")

    return factor


def autocast(precision: str, device: torch.device):  # type: ignore[no-untyped-def]
    if precision == "amp_bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    raise ValueError(f"unsupported precision {precision!r} (fp32 or amp_bf16)")


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--data", required=True, help="folder with train/ and valid/ token shards")
    parser.add_argument("--save-folder", default=None)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    save_folder = Path(args.save_folder or cfg.get("save_folder", "ftout"))

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    seed = int(cfg["seed"])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    tokenizer = AutoTokenizer.from_pretrained(cfg["tokenizer"]["name"])
    model_cfg = cfg["model"]
    model = AutoModelForCausalLM.from_pretrained(
        model_cfg["pretrained_model_name_or_path"], dtype=torch.float32,
        attn_implementation=model_cfg.get("attn_implementation", "eager"))
    model = distribute(model, cfg, device, world)

    opt = cfg["optimizer"]
    if opt.get("name", "adamw") != "adamw":
        raise ValueError(f"unsupported optimizer {opt['name']!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(opt["lr"]), betas=tuple(opt["betas"]),
                                  eps=float(opt["eps"]), weight_decay=float(opt["weight_decay"]))

    loader_cfg = cfg.get("train_loader", {})
    train_data = TokenDataset(Path(args.data) / "train")
    global_batch = int(cfg["global_train_batch_size"])
    micro = int(cfg["device_train_microbatch_size"])
    sampler_args = {"n": len(train_data), "global_batch": global_batch, "seed": seed, "rank": rank,
                    "world": world, "shuffle": loader_cfg.get("shuffle", True),
                    "drop_last": loader_cfg.get("drop_last", True)}
    steps_per_epoch = len(GlobalBatchSampler(epoch=0, **sampler_args))
    total_steps = parse_duration(cfg["max_duration"], steps_per_epoch)
    eval_every = parse_duration(cfg.get("eval_interval", 0), steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg["scheduler"], total_steps, steps_per_epoch))
    max_len = int(cfg["max_seq_len"])
    collate = Collator(tokenizer.eos_token_id, max_len if loader_cfg.get("pad_to_max_length") else None)
    clip = float(cfg.get("gradient_clipping", {}).get("norm", 0.0))
    precision = cfg.get("precision", "fp32")

    step, epoch, started = 0, 0, time.time()
    model.train()
    while step < total_steps:
        sampler = GlobalBatchSampler(epoch=epoch, **sampler_args)
        loader = DataLoader(train_data, batch_sampler=sampler, collate_fn=collate,
                            num_workers=int(loader_cfg.get("num_workers", 0)),
                            pin_memory=device.type == "cuda")
        for batch_size, batch in zip((len(b) for b in sampler.batches()), loader, strict=True):
            optimizer.zero_grad(set_to_none=True)
            rows = batch["input_ids"].shape[0]
            total_loss = 0.0
            for lo in range(0, rows, micro):
                part = {k: v[lo:lo + micro].to(device) for k, v in batch.items()}
                with autocast(precision, device):
                    loss = model(**part).loss
                share = part["input_ids"].shape[0] / batch_size
                (loss * share * world).backward()  # FSDP averages gradients over the ranks
                total_loss += loss.item() * share * world
            if clip > 0:
                if hasattr(model, "clip_grad_norm_"):  # FSDP: the norm over every rank's shard
                    model.clip_grad_norm_(clip)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()
            step += 1
            if rank == 0 and (step % 10 == 0 or step == total_steps):
                print(f"step {step}/{total_steps}  loss {total_loss:.4f}  "
                      f"lr {scheduler.get_last_lr()[0]:.2e}  {time.time() - started:.1f} s", flush=True)
            if eval_every and step % eval_every == 0:
                evaluate(model, Path(args.data) / "valid", cfg, collate, device, precision, rank, world)
                model.train()
            if step >= total_steps:
                break
        epoch += 1

    save_checkpoint(model, optimizer, scheduler, step, epoch, save_folder, rank, world)
    if world > 1:
        dist.destroy_process_group()


@torch.no_grad()
def evaluate(model: torch.nn.Module, folder: Path, cfg: dict[str, Any], collate: Collator,
             device: torch.device, precision: str, rank: int, world: int) -> float:
    """Mean token loss over a split (each rank takes every world-th batch)."""
    model.eval()
    data = TokenDataset(folder)
    loader = DataLoader(data, batch_size=int(cfg["device_eval_batch_size"]), collate_fn=collate,
                        num_workers=int(cfg.get("eval_loader", {}).get("num_workers", 0)),
                        pin_memory=device.type == "cuda")
    totals = torch.zeros(2, device=device, dtype=torch.float64)
    for i, batch in enumerate(loader):
        if i % world != rank:
            continue
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(precision, device):
            loss = model(**batch).loss
        targets = (batch["labels"][:, 1:] != IGNORE).sum()
        totals += torch.stack([loss.double() * targets, targets.double()])
    if world > 1:
        dist.all_reduce(totals)
    mean = (totals[0] / totals[1]).item()
    if rank == 0:
        print(f"eval loss {mean:.4f} over {int(totals[1].item())} tokens", flush=True)
    return mean


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, step: int,
                    epoch: int, folder: Path, rank: int, world: int) -> None:
    """A full training checkpoint (model, optimizer, scheduler, RNG) on rank 0: latest-rank0.pt."""
    if world > 1 and not isinstance(model, torch.nn.parallel.DistributedDataParallel):  # FSDP
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
            model_state = model.state_dict()
            optim_state = FSDP.optim_state_dict(model, optimizer)
    else:
        inner = model.module if world > 1 else model
        model_state = {k: v.cpu() for k, v in inner.state_dict().items()}
        optim_state = optimizer.state_dict()
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        state = {"state": {"model": model_state, "optimizers": {"AdamW": optim_state},
                           "schedulers": [scheduler.state_dict()],
                           "timestamp": {"epoch": epoch, "batch": step}},
                 "rng": {"torch": torch.get_rng_state()}}
        torch.save(state, folder / "latest-rank0.pt")
        print(f"saved checkpoint {folder / 'latest-rank0.pt'} after {step} steps", flush=True)


if __name__ == "__main__":
    main()
