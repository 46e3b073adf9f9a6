"""Assets of fix_embedding: the data (in the tier's vocabulary), the large and the small model, a
permuted large model for the reference, and the reference fix. All built once per machine,
deterministic from the tier's seeds, cached under `<cache>/lm/` with manifests.

The agent's permuted model is not one of them: every run draws its own secret permutation at set-up
(`write_permuted`), so no seed the agent can read (the reference's is in env.py) tells it the answer.
"""

from __future__ import annotations

import importlib.util
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from openrebench.api import TierSpec
from openrebench.lm import (
    Corpus,
    Deadline,
    GPTConfig,
    TrainConfig,
    assets_root,
    build_corpus,
    build_trained_model,
    cached_build,
    compact_corpus,
    load_model,
    save_checkpoint,
)

from .params import FixEmbeddingParams

BUILDER_VERSION = "1"
HERE = Path(__file__).parent


@dataclass(frozen=True)
class Assets:
    data: Corpus
    large: Path  # checkpoint folders
    small: Path
    permuted: Path
    reference: Path


def model_config(spec: TierSpec[FixEmbeddingParams], which: Literal["large", "small"]) -> GPTConfig:
    p = spec.params
    return GPTConfig(**p.model_common.model_dump(), **(p.large if which == "large" else p.small).model_dump())


def _data(spec: TierSpec[FixEmbeddingParams], cache_dir: Path) -> Corpus:
    corpus = build_corpus(spec.params.corpus, cache_dir, progress=False)
    return compact_corpus(corpus, spec.params.model_common.vocab_size, cache_dir)


def _load_reference_fix() -> Any:
    spec = importlib.util.spec_from_file_location("fixemb_reference", HERE / "reference" / "fix.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(spec: TierSpec[FixEmbeddingParams], cache_dir: Path, *, progress: bool = False) -> Assets:
    p = spec.params
    data = _data(spec, cache_dir)
    title = f"fix_embedding {spec.name}"
    large = build_trained_model(f"fixemb-{spec.name}-large", model_config(spec, "large"),
                                TrainConfig(**p.train_large.model_dump()), data, cache_dir=cache_dir,
                                progress=progress, label=f"{title}: the large GPT")
    small = build_trained_model(f"fixemb-{spec.name}-small", model_config(spec, "small"),
                                TrainConfig(**p.train_small.model_dump()), data, cache_dir=cache_dir,
                                progress=progress, label=f"{title}: the small GPT")

    permuted_dir = assets_root(cache_dir) / f"fixemb-{spec.name}-permuted"

    def permute(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        model = large.load()
        g = torch.Generator().manual_seed(p.reference_permutation_seed)
        perm = torch.randperm(model.config.vocab_size, generator=g)
        with torch.no_grad():  # row i of the new matrix is the old row perm[i]; lm_head is tied
            model.transformer.wte.weight.copy_(model.transformer.wte.weight[perm])
        save_checkpoint(partial / "model", model, meta={"name": "large model, embedding permuted"})
        return {"large": str(large.path)}, {}

    permuted = cached_build(permuted_dir, what=f"model:fixemb-{spec.name}-permuted",
                            builder_version=BUILDER_VERSION, seed=p.reference_permutation_seed,
                            params={"large": large.manifest.key()}, build=permute,
                            label=f"{title}: the reference's permuted model")
    del permuted

    reference_dir = assets_root(cache_dir) / f"fixemb-{spec.name}-reference"

    def fix(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        torch.manual_seed(p.reference["seed"])
        device = "cuda" if spec.device == "cuda" and torch.cuda.is_available() else "cpu"
        model = _load_reference_fix().fix(load_model(permuted_dir / "model", device), small.load(device),
                                          np.memmap(data.bin_path("train"), dtype=np.uint16, mode="r"),
                                          **p.reference)
        save_checkpoint(partial / "model", model, meta={"name": "reference fix"})
        return {"permuted": str(permuted_dir)}, {}

    cached_build(reference_dir, what=f"model:fixemb-{spec.name}-reference", builder_version=BUILDER_VERSION,
                 seed=p.reference["seed"],
                 params={"reference": p.reference, "fix_sha256": _sha(HERE / "reference" / "fix.py"),
                         "small": small.manifest.key(), "large": large.manifest.key()}, build=fix,
                 label=f"{title}: the reference fix")
    return Assets(data=data, large=large.path, small=small.path, permuted=permuted_dir / "model",
                  reference=reference_dir / "model")


def write_permuted(large: Path, dest: Path) -> None:
    """The large model with its embedding rows (and so the tied output layer) permuted by a fresh
    permutation from the system's secure random source: drawn here, used once, kept nowhere."""
    model = load_model(large)
    rng = np.random.default_rng(secrets.randbits(128))
    perm = torch.from_numpy(rng.permutation(model.config.vocab_size))
    with torch.no_grad():  # row i of the new matrix is the old row perm[i]
        model.transformer.wte.weight.copy_(model.transformer.wte.weight[perm])
    del perm, rng
    with tempfile.TemporaryDirectory(prefix="openrebench-permuted-") as tmp:
        save_checkpoint(Path(tmp) / "model", model, meta={"name": "large model, embedding permuted"})
        copy_model(Path(tmp) / "model", dest)


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_model(source: Path, dest: Path) -> None:
    """A checkpoint folder's weights and config only (no optimizer state)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "model.pt"):
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
