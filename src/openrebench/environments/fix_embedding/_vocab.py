"""A compact vocabulary for CPU tiers: GPT-2's most frequent tokens in the corpus, plus one UNK.

With GPT-2's 50k tokens the output layer dominates a small model's cost; on two CPU cores that
makes training minutes per hundred steps. Mapping to the top few thousand tokens (UNK for the rest)
keeps the task (a GPT over GPT-2 tokens of real text) at a size a laptop trains in a minute.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def top_tokens(train: np.ndarray, size: int) -> np.ndarray:
    """The `size - 1` most frequent ids of `train` (ties by id), in that order; the last id is UNK."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=65536)
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count descending, then id ascending
    return order[: size - 1].astype(np.int64)


def remap(tokens: np.ndarray, kept: np.ndarray, size: int) -> np.ndarray:
    """GPT-2 ids -> compact ids (the position in `kept`), everything else -> UNK (size - 1)."""
    table = np.full(65536, size - 1, dtype=np.uint16)
    table[kept] = np.arange(len(kept), dtype=np.uint16)
    return table[np.asarray(tokens, dtype=np.int64)]


def write_remapped(source: Path, dest: Path, kept: np.ndarray, size: int) -> int:
    tokens = np.memmap(source, dtype=np.uint16, mode="r")
    out = remap(tokens, kept, size)
    out.tofile(dest)
    return len(out)
