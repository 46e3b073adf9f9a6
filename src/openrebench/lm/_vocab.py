"""A compact vocabulary for small tiers: GPT-2's most frequent tokens in the corpus, plus one UNK.

With GPT-2's 50k tokens the output layer dominates a small model's cost; on two CPU cores that
makes training minutes per hundred steps, and at small compute budgets the best model would be
little more than an embedding table. Mapping to the top few hundred or thousand tokens (UNK for the
rest) keeps the task (a GPT over GPT-2 tokens of real text) at a size that small budgets can train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from openrebench.api import Deadline, assets_root, cached_build

from ._corpus import Corpus
from ._corpus_text import SPLITS

BUILDER_VERSION = "1"


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


def compact_corpus(corpus: Corpus, size: int, cache_dir: Path | None = None) -> Corpus:
    """`corpus` in a `size`-token vocabulary (the top `size - 1` training tokens and UNK), built once
    into `<cache>/lm/corpus-<kind>-v<size>` with `vocab.json` mapping compact ids to GPT-2 ids."""
    if size >= 50257:
        return corpus
    folder = assets_root(cache_dir) / f"corpus-{corpus.kind}-v{size}"

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        kept = top_tokens(corpus.tokens("train"), size)
        counts = {s: write_remapped(corpus.bin_path(s), partial / f"{s}.bin", kept, size) for s in SPLITS}
        (partial / "vocab.json").write_text(json.dumps({"gpt2_ids": kept.tolist(), "unk": size - 1}) + "\n")
        unk = {s: float(np.mean(np.fromfile(partial / f"{s}.bin", dtype=np.uint16) == size - 1))
               for s in SPLITS}
        return {"corpus": str(corpus.path)}, {"tokens": counts, "unk_fraction": unk}

    manifest = cached_build(folder, what=f"corpus:{corpus.kind}-v{size}", builder_version=BUILDER_VERSION,
                            seed=corpus.manifest.seed, params={"size": size, "corpus": corpus.manifest.key()},
                            build=build, label=f"{corpus.kind} corpus, {size}-token vocabulary")
    return Corpus(folder, manifest)
