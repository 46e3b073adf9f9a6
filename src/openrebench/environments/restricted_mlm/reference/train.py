"""Train the reference model (solution.py) on data/train.bin and save it to model.pt.

    python train.py [--max_iters=1500] [--dim=256] ...

First the bigram tables: log P(token | previous token) and log P(token | next token) from counts over
the training text (add-k smoothing towards the unigram distribution); the mask id's rows hold the
unigram distribution, so a masked or missing neighbour adds nothing. Then the convolutions, trained
with AdamW (warm-up, cosine decay) on the masked-LM loss, on top of the fixed tables.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from solution import ConvMLM

HERE = Path(__file__).resolve().parent
VOCAB = json.loads((HERE / "data" / "vocab.json").read_text())

config = {
    "data_dir": str(HERE / "data"), "seq_len": VOCAB["seq_len"], "mask_prob": VOCAB["mask_prob"],
    "dim": 128, "layers": 4, "kernel": 7, "expansion": 2, "bigrams": True, "smoothing": 1.0,
    "batch_size": 32, "max_iters": 600, "lr": 3e-3, "warmup_iters": 50, "weight_decay": 0.01,
    "grad_clip": 1.0,
    "eval_iters": 10, "seed": 0, "threads": 0, "device": "cuda" if torch.cuda.is_available() else "cpu",
    "out": str(HERE / "model.pt"),
}


def bigram_tables(tokens: np.ndarray, vocab: int, mask_id: int, k: float) -> tuple[torch.Tensor, ...]:
    """log P(t | previous), log P(t | next) as (V, V) tables indexed [neighbour, t], and log P(t)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    unigram = np.bincount(tokens, minlength=vocab).astype(np.float64) + 0.5
    unigram /= unigram.sum()
    pairs = np.bincount(tokens[:-1] * vocab + tokens[1:], minlength=vocab * vocab).reshape(vocab, vocab)

    def conditional(counts: np.ndarray) -> torch.Tensor:
        probs = (counts + k * vocab * unigram) / (counts.sum(1, keepdims=True) + k * vocab)
        probs[mask_id] = unigram
        return torch.from_numpy(np.log(probs)).to(torch.float16)

    return conditional(pairs), conditional(pairs.T), torch.from_numpy(np.log(unigram)).float()


def get_batch(tokens: np.ndarray, cfg: dict, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    n, t = cfg["batch_size"], cfg["seq_len"]
    starts = torch.randint(len(tokens) - t, (n,), generator=generator).tolist()
    original = torch.from_numpy(np.stack([tokens[s:s + t].astype(np.int64) for s in starts]))
    mask = torch.rand((n, t), generator=generator) < cfg["mask_prob"]
    x = torch.where(mask, VOCAB["mask_id"], original)
    return x.to(cfg["device"]), original.to(cfg["device"]), mask.to(cfg["device"])


def learning_rate(it: int, cfg: dict) -> float:
    if it < cfg["warmup_iters"]:
        return cfg["lr"] * (it + 1) / cfg["warmup_iters"]
    progress = (it - cfg["warmup_iters"]) / max(1, cfg["max_iters"] - cfg["warmup_iters"])
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, tokens: np.ndarray, cfg: dict) -> float:
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(cfg["eval_iters"]):
        x, y, mask = get_batch(tokens, cfg, generator)
        losses.append(F.cross_entropy(model(x, positions=mask), y[mask]).item())
    model.train()
    return sum(losses) / len(losses)


def train(**overrides: object) -> dict:
    cfg = {**config, **overrides}
    if cfg["threads"]:  # one thread is much faster than two on a busy machine
        torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])
    train_tokens = np.memmap(Path(cfg["data_dir"]) / "train.bin", dtype=np.uint16, mode="r")
    val_tokens = np.memmap(Path(cfg["data_dir"]) / "val.bin", dtype=np.uint16, mode="r")
    model_config = {"vocab_size": VOCAB["vocab_size"], "seq_len": cfg["seq_len"], "mask_id": VOCAB["mask_id"],
                    **{k: cfg[k] for k in ("dim", "layers", "kernel", "expansion", "bigrams")}}
    model = ConvMLM(**model_config)
    if cfg["bigrams"]:
        before, after, unigram = bigram_tables(train_tokens, VOCAB["vocab_size"], VOCAB["mask_id"],
                                               cfg["smoothing"])
        model.before.copy_(before)
        model.after.copy_(after)
        model.unigram.copy_(unigram)
    model.to(cfg["device"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    # bf16 autocast on a GPU (the weights stay fp32); the CPU path is plain fp32
    cuda = str(cfg["device"]).startswith("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    generator = torch.Generator().manual_seed(cfg["seed"])
    started = time.time()
    for it in range(cfg["max_iters"]):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(it, cfg)
        x, y, mask = get_batch(train_tokens, cfg, generator)
        with autocast:
            loss = F.cross_entropy(model(x, positions=mask).float(), y[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        if it % 100 == 0 or it == cfg["max_iters"] - 1:
            print(f"iter {it}: loss {loss.item():.4f} ({time.time() - started:.0f} s)", flush=True)
    val_loss = estimate_loss(model, val_tokens, cfg)
    print(f"validation loss {val_loss:.4f}; saving {cfg['out']}")
    torch.save({"config": model_config, "state_dict": model.cpu().state_dict()}, cfg["out"])
    return {"val_loss": val_loss, "iters": cfg["max_iters"], "seconds": time.time() - started}


if __name__ == "__main__":
    args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:])
    train(**{k: (v.lower() == "true") if isinstance(config[k], bool) else type(config[k])(v)
             for k, v in args.items()})
