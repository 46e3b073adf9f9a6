"""The reference masked language model: a residual stack of 1-D convolutions plus bigram tables.

Within the rules: the convolution is built from as_strided (a sliding-window view) and einsum, the
blocks are residual with learned scalar gates instead of normalisation (no division), and the
tables of log P(token | previous token) and log P(token | next token) are constants computed from
the training text before training (train.py), read by indexing with the neighbouring token ids.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
VOCAB = json.loads((HERE / "data" / "vocab.json").read_text())


def conv1d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """'Same' 1-D convolution over time: x (B, T, C), weight (K, C, D) -> (B, T, D)."""
    b, t, c = x.shape
    k = weight.shape[0]
    pad = x.new_zeros(b, k // 2, c)
    padded = torch.cat([pad, x, pad], dim=1).contiguous()
    s_b, s_t, s_c = padded.stride()
    windows = padded.as_strided((b, t, k, c), (s_b, s_t, s_t, s_c))  # windows[b, t] = padded[b, t:t + k]
    return (windows.reshape(b * t, k * c) @ weight.reshape(k * c, -1)).reshape(b, t, -1)


class Block(nn.Module):
    def __init__(self, dim: int, kernel: int, expansion: int) -> None:
        super().__init__()
        self.conv = nn.Parameter(torch.randn(kernel, dim, dim) / math.sqrt(kernel * dim))
        self.up = nn.Linear(dim, expansion * dim)
        self.down = nn.Linear(expansion * dim, dim)
        self.gate = nn.Parameter(torch.zeros(()))  # starts as the identity (ReZero)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.gate * self.down(F.relu(self.up(F.relu(conv1d(h, self.conv)))))


class ConvMLM(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, mask_id: int, dim: int, layers: int, kernel: int,
                 expansion: int, bigrams: bool) -> None:
        super().__init__()
        self.mask_id, self.bigrams = mask_id, bigrams
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, kernel, expansion) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)
        nn.init.zeros_(self.head.weight)  # the untrained model is the bigram tables alone
        nn.init.zeros_(self.head.bias)
        if bigrams:  # filled by train.py from the training text; fp16 halves their size
            self.register_buffer("before", torch.zeros(vocab_size, vocab_size, dtype=torch.float16))
            self.register_buffer("after", torch.zeros(vocab_size, vocab_size, dtype=torch.float16))
            self.register_buffer("unigram", torch.zeros(vocab_size))
            self.bigram_weight = nn.Parameter(torch.ones(()))

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); training passes the masked `positions` to compute only those rows."""
        h = self.embed(idx) + self.pos
        for block in self.blocks:
            h = block(h)
        if positions is not None:
            h = h[positions]
        logits = self.head(h)
        if self.bigrams:
            edge = torch.full_like(idx[:, :1], self.mask_id)  # no neighbour: the mask's row is uninformative
            padded = torch.cat([edge, idx, edge], dim=1)
            previous, following = padded[:, :-2], padded[:, 2:]
            if positions is not None:
                previous, following = previous[positions], following[positions]
            table = F.embedding(previous, self.before).float() + F.embedding(following, self.after).float()
            logits = logits + self.bigram_weight * (table - self.unigram)
        return logits


def get_trained_model() -> nn.Module:
    checkpoint = torch.load(HERE / "model.pt", map_location="cpu", weights_only=True)
    model = ConvMLM(**checkpoint["config"])
    model.load_state_dict(checkpoint["state_dict"])
    return model
