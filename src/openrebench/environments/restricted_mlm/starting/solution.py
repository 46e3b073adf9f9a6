"""A masked language model within the rules: a small MLP over the whole (flattened) sequence.

The scorer imports this file, calls get_trained_model() and runs the model's forward pass on held-out
text: token ids of shape (batch, seq_len), some replaced by the mask id, to logits of shape
(batch, seq_len, vocab_size). The forward pass may use only the allowed operations (see the
instructions); train.py trains this model and writes model.pt, which get_trained_model() loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
VOCAB = json.loads((HERE / "data" / "vocab.json").read_text())


class Model(nn.Module):
    """Embedding -> flatten -> (Linear + ReLU) x 2 -> unflatten -> Linear, as the paper's starting model."""

    def __init__(self, vocab_size: int, seq_len: int, embed_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.seq_len, self.embed_dim, self.out_dim = seq_len, embed_dim, out_dim
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.fc1 = nn.Linear(seq_len * embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, seq_len * out_dim)
        self.head = nn.Linear(out_dim, vocab_size)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); training passes the masked `positions` to compute only those rows."""
        b, t = idx.shape
        h = self.embed(idx).reshape(b, t * self.embed_dim)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h)).reshape(b, t, self.out_dim)
        if positions is not None:
            h = h[positions]
        return self.head(h)


def get_trained_model() -> nn.Module:
    checkpoint = torch.load(HERE / "model.pt", map_location="cpu", weights_only=True)
    model = Model(**checkpoint["config"])
    model.load_state_dict(checkpoint["state_dict"])
    return model
