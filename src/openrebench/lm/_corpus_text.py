"""A corpus's text before tokenising: documents cleaned, deduplicated by paragraph and split by group, so
that no paragraph and no work is shared between the training and the held-out text. Apart from the
builder (`_corpus.py`) and the sources (`_corpus_sources.py`), which both use it."""

from __future__ import annotations

import hashlib
import random
import re
import textwrap
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

SPLITS = ("train", "val", "heldout")
MAX_DOCUMENT_CHARS = 64_000  # longer texts (a dictionary, a manual) are cut into documents at paragraphs


class Document(NamedTuple):
    group: str  # documents of one group always land in the same split
    name: str
    text: str


# ---------------------------------------------------------------- cleaning, deduplication, splitting

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BLANK_LINES = re.compile(r"\n\s*\n")


def clean_paragraphs(text: str) -> list[str]:
    """Normalised paragraphs (NFC, no control characters or trailing spaces, common indent removed)."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text.replace("\ufeff", ""))
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        lines = [line.rstrip() for line in block.split("\n")]
        paragraph = textwrap.dedent("\n".join(lines)).strip("\n")
        if paragraph.strip():
            paragraphs.append(paragraph)
    return paragraphs


def paragraph_key(paragraph: str) -> bytes:
    """Paragraphs equal up to case and whitespace are duplicates."""
    return hashlib.blake2b(" ".join(paragraph.lower().split()).encode(), digest_size=16).digest()


def _pieces(paragraphs: list[str], max_chars: int = MAX_DOCUMENT_CHARS) -> Iterator[list[str]]:
    piece: list[str] = []
    size = 0
    for paragraph in paragraphs:
        if piece and size + len(paragraph) > max_chars:
            yield piece
            piece, size = [], 0
        piece.append(paragraph)
        size += len(paragraph) + 2
    if piece:
        yield piece


def plan_splits(documents: Iterable[Document], seed: int, val_fraction: float, heldout_fraction: float,
                max_documents: int | None = None) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Clean, deduplicate and split documents: ({split: [text, ...]}, statistics).

    Groups are visited in a seeded random order; a paragraph seen before (anywhere) is dropped; then
    whole groups fill the validation and held-out splits up to their fractions of the characters.
    """
    by_group: dict[str, list[Document]] = {}
    for doc in sorted(documents, key=lambda d: (d.group, d.name)):
        by_group.setdefault(doc.group, []).append(doc)
    groups = sorted(by_group)
    random.Random(seed).shuffle(groups)
    seen: set[bytes] = set()
    kept: list[tuple[str, list[str]]] = []
    stats = {"paragraphs": 0, "duplicate_paragraphs": 0, "documents": 0}
    taken = 0
    for group in groups:
        for doc in by_group[group]:
            if max_documents is not None and taken >= max_documents:
                break
            taken += 1
            unique = []
            for paragraph in clean_paragraphs(doc.text):
                stats["paragraphs"] += 1
                key = paragraph_key(paragraph)
                if key in seen:
                    stats["duplicate_paragraphs"] += 1
                    continue
                seen.add(key)
                unique.append(paragraph)
            kept.extend((group, piece) for piece in _pieces(unique))
    total = sum(len(p) for _, piece in kept for p in piece)
    targets = {"val": val_fraction * total, "heldout": heldout_fraction * total}
    size = dict.fromkeys(SPLITS, 0)
    assignment: dict[str, str] = {}
    texts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for group, piece in kept:
        if group not in assignment:
            open_splits = [s for s in ("val", "heldout") if size[s] < targets[s]]
            assignment[group] = open_splits[0] if open_splits else "train"
        split = assignment[group]
        text = "\n\n".join(piece)
        texts[split].append(text)
        size[split] += len(text)
    stats["documents"] = sum(len(t) for t in texts.values())
    stats["groups"] = {s: sum(1 for g in assignment.values() if g == s) for s in SPLITS}
    stats["chars"] = size
    return texts, stats
