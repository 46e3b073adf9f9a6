"""Train the model of solution.py on data/train.bin and save it to model.pt (what get_trained_model loads).

    python train.py                       # the settings below
    python train.py --max_iters=2000 --lr=3e-4

Masked-LM training as the scorer evaluates: windows of seq_len tokens, each position replaced by the
mask id with probability mask_prob, cross-entropy at the masked positions only. Everything outside
the model's forward pass (this file) may use any operation.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from solution import Model

HERE = Path(__file__).resolve().parent
VOCAB = json.loads((HERE / "data" / "vocab.json").read_text())

config = {
    # data
    "data_dir": str(HERE / "data"), "seq_len": VOCAB["seq_len"], "mask_prob": VOCAB["mask_prob"],
    # model
    "embed_dim": 32, "hidden": 512, "out_dim": 8,
    # training
    "batch_size": 16, "max_iters": 500, "lr": 1e-3, "weight_decay": 0.0, "eval_iters": 10, "seed": 0,
    "threads": 0, "device": "cuda" if torch.cuda.is_available() else "cpu", "out": str(HERE / "model.pt"),
}


def get_batch(tokens: np.ndarray, cfg: dict, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random windows; masked positions get the mask id. Returns input, targets and the mask."""
    n, t = cfg["batch_size"], cfg["seq_len"]
    starts = torch.randint(len(tokens) - t, (n,), generator=generator).tolist()
    original = torch.from_numpy(np.stack([tokens[s:s + t].astype(np.int64) for s in starts]))
    mask = torch.rand((n, t), generator=generator) < cfg["mask_prob"]
    x = torch.where(mask, VOCAB["mask_id"], original)
    return x.to(cfg["device"]), original.to(cfg["device"]), mask.to(cfg["device"])


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
    model_config = {"vocab_size": VOCAB["vocab_size"], "seq_len": cfg["seq_len"],
                    **{k: cfg[k] for k in ("embed_dim", "hidden", "out_dim")}}
    model = Model(**model_config).to(cfg["device"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    generator = torch.Generator().manual_seed(cfg["seed"])
    started = time.time()
    for it in range(cfg["max_iters"]):
        x, y, mask = get_batch(train_tokens, cfg, generator)
        loss = F.cross_entropy(model(x, positions=mask), y[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if it % 100 == 0 or it == cfg["max_iters"] - 1:
            print(f"iter {it}: loss {loss.item():.4f} ({time.time() - started:.0f} s)", flush=True)
    val_loss = estimate_loss(model, val_tokens, cfg)
    print(f"validation loss {val_loss:.4f}; saving {cfg['out']}")
    torch.save({"config": model_config, "state_dict": model.cpu().state_dict()}, cfg["out"])
    return {"val_loss": val_loss, "iters": cfg["max_iters"], "seconds": time.time() - started}


if __name__ == "__main__":
    args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:])
    train(**{k: type(config[k])(v) for k, v in args.items()})
