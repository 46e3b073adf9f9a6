"""The reference fix: map the small model's embeddings into the large model's space, then train.

The large model's blocks are intact; only its token embedding (tied to the output layer) is
scrambled. The small model, trained on the same data, knows what every token means in its own
64-or-so dimensions. A linear map A (small -> large) gives every token a guess in the large space,
E = E_small @ A^T; training A alone with the large blocks frozen aligns the two spaces cheaply.
Folding E in as the new embedding and fine-tuning everything then recovers most of the loss.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from openrebench.lm import GPT, batch_generator, get_batch


def forward_with(model: GPT, emb: torch.Tensor, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's loss with `emb` as its (tied) token embedding."""
    t = model.transformer
    pos = torch.arange(idx.shape[1], device=idx.device)
    x = t.drop(emb[idx] + t.wpe(pos))
    for block in t.h:
        x = block(x)
    logits = t.ln_f(x) @ emb.T
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def fix(large: GPT, small: GPT, train: object, *, map_steps: int, tune_steps: int, batch_size: int,
        lr_map: float = 3e-2, lr_tune: float = 1e-3, seed: int = 0) -> GPT:
    device = next(large.parameters()).device
    small = small.to(device)
    autocast = (torch.autocast("cuda", torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext())
    block = large.config.block_size
    small_emb = small.transformer.wte.weight.detach()
    A = torch.nn.Parameter(torch.randn(large.config.n_embd, small.config.n_embd, device=device)
                           * small.config.n_embd**-0.5)
    for p in large.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([A], lr=lr_map)
    for step in range(map_steps):
        x, y = get_batch(train, batch_size, block, batch_generator(seed, step), device)  # type: ignore[arg-type]
        with autocast:
            loss = forward_with(large, small_emb @ A.T, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        large.transformer.wte.weight.copy_(small_emb @ A.T)  # fold in; lm_head follows (tied)
    for p in large.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(large.parameters(), lr=lr_tune, weight_decay=0.0)
    for step in range(tune_steps):
        x, y = get_batch(train, batch_size, block, batch_generator(seed + 1, step), device)  # type: ignore[arg-type]
        with autocast:
            _, loss = large(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(large.parameters(), 1.0)
        opt.step()
    return large.cpu()
