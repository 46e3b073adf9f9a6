"""Assets of restricted_mlm: the token data in the tier's vocabulary, and the trained weights of the starting
and the reference solution. Built once per machine, deterministic from the tier's seeds, cached under
`<cache>/lm/` with manifests.

The weights are trained by the solutions' own `train.py`, run as the agent would run it (in a fresh
process, from a folder holding `solution.py`, `train.py` and `data/`), so the agent starts from a
solution whose weights it can reproduce.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from openrebench.api import TierSpec, stage
from openrebench.base import usable_cores
from openrebench.lm import SPLITS, AssetError, Deadline, Manifest, assets_root, build_corpus, cached_build

from .params import RestrictedMLMParams

BUILDER_VERSION = "1"
HERE = Path(__file__).parent
DATA_FILES = ("train.bin", "val.bin", "vocab.json")  # what the agent gets (heldout.bin goes to protected/)


@dataclass(frozen=True)
class Assets:
    data: Path  # train.bin, val.bin, heldout.bin (uint16 ids in the tier's vocabulary) and vocab.json
    start: Path  # model.pt of the starting solution
    reference: Path  # model.pt of the reference solution


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def top_tokens(train: np.ndarray, kept: int) -> np.ndarray:
    """The `kept` most frequent GPT-2 ids of the training split (ties by id), most frequent first."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=65536)
    return np.lexsort((np.arange(len(counts)), -counts))[:kept].astype(np.int64)


def _data(spec: TierSpec[RestrictedMLMParams], cache_dir: Path) -> tuple[Path, Manifest]:
    """The corpus in the tier's vocabulary. Below GPT-2's 50,257 tokens: the most frequent ones, then UNK
    (every other token) and MASK, so a CPU model's output layer stays small."""
    p = spec.params
    corpus = build_corpus(p.corpus, cache_dir, progress=False)
    vocab, mask_id, unk_id = p.vocab_size, p.mask_id, p.unk_id
    folder = assets_root(cache_dir) / f"rmlm-data-{corpus.kind}-v{vocab}"

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        info: dict[str, Any] = {"vocab_size": vocab, "mask_id": mask_id, "unk_id": unk_id,
                                "seq_len": p.seq_len, "mask_prob": p.mask_prob}
        stats: dict[str, Any] = {}
        if unk_id is None:  # GPT-2's own vocabulary: the corpus as it is
            for split in SPLITS:
                shutil.copyfile(corpus.bin_path(split), partial / f"{split}.bin")
            info["gpt2_ids"] = None
        else:
            kept = top_tokens(corpus.tokens("train"), vocab - 2)
            table = np.full(65536, unk_id, dtype=np.uint16)
            table[kept] = np.arange(len(kept), dtype=np.uint16)
            for split in SPLITS:
                mapped = table[np.asarray(corpus.tokens(split), dtype=np.int64)]
                mapped.tofile(partial / f"{split}.bin")
                stats[f"{split}_unk_fraction"] = round(float(np.mean(mapped == unk_id)), 5)
            info["gpt2_ids"] = kept.tolist()
        (partial / "vocab.json").write_text(json.dumps(info) + "\n")
        return {"corpus": str(corpus.path)}, stats

    params = {"corpus": corpus.manifest.key(), "vocab_size": vocab, "mask_id": mask_id, "unk_id": unk_id,
              "seq_len": p.seq_len, "mask_prob": p.mask_prob}
    manifest = cached_build(folder, what=f"rmlm-data:{corpus.kind}-v{vocab}", builder_version=BUILDER_VERSION,
                            seed=corpus.manifest.seed, params=params, build=build,
                            label=f"restricted_mlm: {corpus.kind} corpus, {vocab}-token vocabulary")
    return folder, manifest


_ITER = re.compile(rb"^iter (\d+):", re.MULTILINE)


def _follow(process: subprocess.Popen[bytes], log: Path, max_iters: int | None) -> int:
    """Wait for a training process, reporting its steps from the `iter N:` lines of its log (the
    solutions' train.py prints one every 100 steps); its exit code."""
    with stage("training", total=max_iters) as steps:
        try:
            while process.poll() is None:
                time.sleep(0.5)
                if found := _ITER.findall(log.read_bytes()):
                    steps.update(int(found[-1]) + 1)
        finally:
            if process.poll() is None:  # interrupted: the training must not outlive the build
                process.kill()
            process.wait()
    return process.returncode


def _trained(which: Literal["starting", "reference"], spec: TierSpec[RestrictedMLMParams], data: Path,
             data_manifest: Manifest, cache_dir: Path) -> Path:
    """Run `<which>/train.py` (starting or reference) with the tier's settings; the folder holds model.pt."""
    source = HERE / which
    overrides = dict(spec.params.train_start if which == "starting" else spec.params.train_reference)
    folder = assets_root(cache_dir) / f"rmlm-{which}-{spec.name}"

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        work = partial / "work"
        for name in ("solution.py", "train.py"):
            shutil.copyfile(source / name, work / name)
        (work / "data").mkdir(exist_ok=True)
        for name in DATA_FILES:
            if not (work / "data" / name).exists():
                os.symlink(data / name, work / "data" / name)
        # The tier's thread count, never more than the cores this process may use: the mini reference
        # trains on two (63 s against 100 s on one, a quiet 2-core Xeon); the starting model, small, on one.
        run = {**overrides, **({"threads": usable_cores(at_most=int(overrides["threads"]))}
                               if overrides.get("threads") else {})}
        args = [f"--{k}={v}" for k, v in run.items()]
        log = partial / "train.log"
        with open(log, "w") as out:
            command = [sys.executable, "train.py", f"--out={partial / 'model.pt'}", *args]
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            process = subprocess.Popen(command, cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env)
            returncode = _follow(process, log, overrides.get("max_iters"))
        if returncode != 0 or not (partial / "model.pt").is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise AssetError(f"training the {which} model failed (exit code {returncode}):\n{tail}")
        lines = [line for line in log.read_text().splitlines() if line.startswith("validation loss")]
        stats = {"validation": lines[-1] if lines else None}
        return {"data": str(data), "train.py": str(source / "train.py")}, stats

    params = {"train": overrides, "data": data_manifest.key(),
              "code_sha256": {name: _sha256(source / name) for name in ("solution.py", "train.py")}}
    cached_build(folder, what=f"rmlm-model:{which}-{spec.name}", builder_version=BUILDER_VERSION,
                 seed=overrides.get("seed"), params=params, build=build,
                 label=f"restricted_mlm {spec.name}: the {which} model")
    return folder


def build(spec: TierSpec[RestrictedMLMParams], cache_dir: Path) -> Assets:
    data, manifest = _data(spec, cache_dir)
    start = _trained("starting", spec, data, manifest, cache_dir)
    reference = _trained("reference", spec, data, manifest, cache_dir)
    return Assets(data=data, start=start, reference=reference)
