"""GPT-2 BPE offline: rebuilt files match OpenAI's, and tiktoken and Hugging Face give the same ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from openrebench.lm import EOT, Corpus, gpt2_hf_tokenizer, gpt2_tokenizer, gpt2_tokenizer_dir, load_manifest
from openrebench.lm._tokenizer import URLS

pytest_plugins = ["lm_support"]

SAMPLE = ("The quick brown fox jumps over the lazy dog.\n\n  Indented line\twith a tab, "
          "café, naïve, Straße, Ελληνικά, русский, 日本語, 한국어, emoji 🚀🎉, math ∑x² ≤ π, "
          "numbers 1234567 and 3.14159, contractions it's we'll they've, URLs https://example.org/a?b=c "
          "and trailing spaces   \n\n\n")


def _real_text(corpus: Corpus) -> str:
    """About 20,000 tokens of the validation text, with the documents' end-of-text marks in place."""
    return gpt2_tokenizer(corpus.path.parent.parent).decode(corpus.tokens("val")[:20000].tolist())


def test_files_are_openai_gpt2_byte_for_byte(lm_home: Path) -> None:
    folder = gpt2_tokenizer_dir(lm_home)
    manifest = load_manifest(folder)
    assert manifest is not None
    for name, target in (("r50k_base.tiktoken", "gpt2.tiktoken"), ("encoder.json", "vocab.json"),
                         ("vocab.bpe", "merges.txt")):
        url, sha = URLS[name]
        assert manifest.files[target].sha256 == sha
        cached = folder / "tiktoken" / hashlib.sha1(url.encode()).hexdigest()
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha
    vocab = json.loads((folder / "vocab.json").read_text())
    assert len(vocab) == 50257 and vocab["<|endoftext|>"] == EOT


def test_tiktoken_and_hf_ids_identical(lm_home: Path, mini_corpus: Corpus) -> None:
    enc, hf = gpt2_tokenizer(lm_home), gpt2_hf_tokenizer(lm_home)
    real = _real_text(mini_corpus)
    assert "<|endoftext|>" in real
    for text in (SAMPLE, real.replace("<|endoftext|>", "\n")):
        ids = enc.encode_ordinary(text)
        assert hf.encode(text).ids == ids
        assert enc.decode(ids) == text
        assert hf.decode(ids) == text
    # the end-of-text mark: one special token for both (when tiktoken is allowed to read it as one)
    ids = enc.encode(real, allowed_special="all")
    assert hf.encode(real).ids == ids and ids.count(EOT) == real.count("<|endoftext|>")
    assert hf.decode(ids, skip_special_tokens=False) == real == enc.decode(ids)
    assert enc.encode_ordinary("Hello world") == [15496, 995]  # GPT-2's well-known ids
    assert enc.n_vocab == 50257 and enc.eot_token == EOT
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]


def test_tiktoken_get_encoding_works_offline_from_the_cache_folder(lm_home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken
    import tiktoken.registry

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(gpt2_tokenizer_dir(lm_home) / "tiktoken"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # forget encodings loaded earlier
    expected = gpt2_tokenizer(lm_home).encode_ordinary(SAMPLE)
    for name in ("gpt2", "r50k_base"):
        assert tiktoken.get_encoding(name).encode_ordinary(SAMPLE) == expected


def test_transformers_loads_the_folder(lm_home: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir(lm_home))
    assert tok(SAMPLE)["input_ids"] == gpt2_tokenizer(lm_home).encode_ordinary(SAMPLE)
    assert tok.eos_token_id == EOT
