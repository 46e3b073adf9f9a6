"""The language-model stack shared by the GPT environments (fix_embedding, restricted_mlm, scaling_law,
chat_rl).

- Corpora: `build_corpus("mini" | "dictionary" | "full" | "openwebtext" | "auto")` gives nanoGPT-style
  uint16 token files (`train.bin`, `val.bin`, `heldout.bin`): OpenWebText where `datasets` and the
  network allow, offline stand-ins from public-domain text obtained through pip (mini), pip and one
  Debian dictionary (dictionary), or apt (full).
- Tokenizer: GPT-2's BPE offline, as a tiktoken Encoding (`gpt2_tokenizer`) and a Hugging Face tokenizer
  (`gpt2_hf_tokenizer`, or `GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())`), same ids.
- Model and training: a nanoGPT-style `GPT`, `train`, `evaluate`, checkpoints, and trained models as
  cached assets (`build_trained_model`).
- Compact vocabularies for small tiers: `compact_corpus(corpus, size)` keeps the most frequent tokens
  and maps the rest to UNK.

Every built asset lives under `<cache>/lm/` with a manifest of sha256 checksums, verified on reuse.
"""

from typing import TYPE_CHECKING, Any

from openrebench.api import (
    AssetError,
    BuildIncomplete,
    Deadline,
    Manifest,
    asset_key,
    assets_root,
    cached_build,
    load_manifest,
    verify,
)

if TYPE_CHECKING:
    from ._checkpoint import Checkpoint, load_checkpoint, load_model, save_checkpoint
    from ._corpus import Corpus, build_corpus, load_corpus
    from ._corpus_sources import gcide_root, openwebtext_available
    from ._corpus_text import SPLITS
    from ._gcide import first_sense, gcide_entries, plain_entries
    from ._model import GPT, GPTConfig
    from ._pretrained import TrainedModel, build_trained_model
    from ._sources import pypi_archive, sources_dir
    from ._tokenizer import EOT, gpt2_hf_tokenizer, gpt2_tokenizer, gpt2_tokenizer_dir
    from ._train import TrainConfig, TrainResult, batch_generator, evaluate, get_batch, learning_rate, train
    from ._vocab import compact_corpus

# Each name's module, imported on first use: what needs only the corpus, the dictionary or the tokenizer
# (a scorer reading ground truth, the instruction builder) does not pay for torch's import (2 s a process).
_LAZY = {
    name: module
    for module, names in {
        "_checkpoint": ("Checkpoint", "load_checkpoint", "load_model", "save_checkpoint"),
        "_corpus": ("Corpus", "build_corpus", "load_corpus"),
        "_corpus_sources": ("gcide_root", "openwebtext_available"),
        "_corpus_text": ("SPLITS",),
        "_gcide": ("first_sense", "gcide_entries", "plain_entries"),
        "_model": ("GPT", "GPTConfig"),
        "_pretrained": ("TrainedModel", "build_trained_model"),
        "_sources": ("pypi_archive", "sources_dir"),
        "_tokenizer": ("EOT", "gpt2_hf_tokenizer", "gpt2_tokenizer", "gpt2_tokenizer_dir"),
        "_train": (
            "TrainConfig",
            "TrainResult",
            "batch_generator",
            "evaluate",
            "get_batch",
            "learning_rate",
            "train",
        ),
        "_vocab": ("compact_corpus",),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "EOT",
    "GPT",
    "SPLITS",
    "AssetError",
    "BuildIncomplete",
    "Checkpoint",
    "Corpus",
    "Deadline",
    "GPTConfig",
    "Manifest",
    "TrainConfig",
    "TrainResult",
    "TrainedModel",
    "asset_key",
    "assets_root",
    "batch_generator",
    "build_corpus",
    "build_trained_model",
    "cached_build",
    "compact_corpus",
    "evaluate",
    "first_sense",
    "gcide_entries",
    "gcide_root",
    "get_batch",
    "gpt2_hf_tokenizer",
    "gpt2_tokenizer",
    "gpt2_tokenizer_dir",
    "learning_rate",
    "load_checkpoint",
    "load_corpus",
    "load_manifest",
    "load_model",
    "openwebtext_available",
    "plain_entries",
    "pypi_archive",
    "save_checkpoint",
    "sources_dir",
    "train",
    "verify",
]
