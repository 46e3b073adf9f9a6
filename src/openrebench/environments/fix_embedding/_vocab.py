"""fix_embedding's compact vocabulary: the shared one of the language-model stack."""

from __future__ import annotations

from openrebench.lm._vocab import remap, top_tokens, write_remapped

__all__ = ["remap", "top_tokens", "write_remapped"]
