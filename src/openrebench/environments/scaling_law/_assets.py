"""Assets of scaling_law: the data in the tier's vocabulary, the stored ground truth (checked against
that data and the tier's setup) and the reference answer, which the reference procedure reaches by
running its own small experiments (cached under `<cache>/lm/`), or which ships with the tier
(`reference/answer--<tier>.json`, from `openrebench build scaling_law --ship`) for builds of its key."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openrebench.api import Environment, OpenRebenchError, TierSpec, stage
from openrebench.lm import (
    Corpus,
    Deadline,
    asset_key,
    assets_root,
    build_corpus,
    cached_build,
    compact_corpus,
)

from ._ground_truth import DataKey, GroundTruth, ground_truth_path
from .experiment import run_experiment
from .params import ScalingLawParams, Setup

BUILDER_VERSION = "1"
HERE = Path(__file__).parent
SWEEP_COMMAND = "openrebench build scaling_law --tier {tier} --ship"


@dataclass(frozen=True)
class Assets:
    data: Corpus
    setup: Setup
    ground_truth: Path
    reference_answer: Path | None  # None when not asked for


def device_for(spec: TierSpec[ScalingLawParams]) -> str:
    return "cuda" if spec.device == "cuda" and torch.cuda.is_available() else "cpu"


def data_for(spec: TierSpec[ScalingLawParams], cache_dir: Path) -> Corpus:
    corpus = build_corpus(spec.params.corpus, cache_dir, progress=False)
    return compact_corpus(corpus, spec.params.setup.vocab_size, cache_dir)


def ground_truth_file(env: Environment, spec: TierSpec[ScalingLawParams]) -> Path:
    """The stored sweep's file; a tier without one stops here with the command that computes it."""
    path = ground_truth_path(env.root, spec.name)
    if not path.is_file():
        raise OpenRebenchError(f"scaling_law {spec.name}: no ground truth yet ({path.name} is missing); "
                               f"compute it with `{SWEEP_COMMAND.format(tier=spec.name)}`")
    return path


def load_ground_truth(env: Environment, spec: TierSpec[ScalingLawParams], setup: Setup,
                      data: Corpus) -> tuple[GroundTruth, Path]:
    """The stored sweep for this tier, checked against this machine's data and the tier's setup."""
    path = ground_truth_file(env, spec)
    again = SWEEP_COMMAND.format(tier=spec.name)
    truth = GroundTruth.model_validate_json(path.read_text())
    if truth.setup != setup:
        raise OpenRebenchError(f"scaling_law {spec.name}: {path.name} was computed for a different training "
                               f"setup; compute it again with `{again}`")
    if truth.data != DataKey.of(data, setup.vocab_size):
        raise OpenRebenchError(f"scaling_law {spec.name}: {path.name} was computed on different data than "
                               f"this machine's {data.kind} corpus; compute it again with `{again}`")
    return truth, path


def _load_fit() -> Any:
    spec = importlib.util.spec_from_file_location("scaling_law_reference", HERE / "reference" / "fit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def reference_answer_path(spec: TierSpec[ScalingLawParams], cache_dir: Path | None) -> Path:
    """Where `reference_answer` keeps the answer (it exists once built)."""
    return assets_root(cache_dir) / f"scaling-{spec.name}-reference" / "answer.json"


def shipped_answer_path(root: Path, tier: str) -> Path:
    """The reference answer `openrebench build scaling_law --ship` stores beside the ground truth (in
    `reference/`, hidden from every sandbox as the ground truth is), with the key of the build it came
    from."""
    return root / "reference" / f"answer--{tier}.json"


def reference_answer(spec: TierSpec[ScalingLawParams], setup: Setup, data: Corpus,
                     cache_dir: Path | None, *, shipped: Path | None = None) -> Path:
    """The reference procedure's answer (its own grid of experiments under the cap, a fitted scaling
    law) and the evidence behind it, cached. Taken from `shipped` where that file was made by a build
    of the same key (the same setup, procedure, data and fit.py: the procedure runs on one CPU thread,
    so it would reach the same answer here), else run once (a minute on 2 cores for the mini tier)."""
    p = spec.params.reference
    folder = reference_answer_path(spec, cache_dir).parent
    fit_py = HERE / "reference" / "fit.py"
    what = f"answer:scaling_law-{spec.name}-reference"
    params = {"setup": setup.model_dump(), "reference": p.model_dump(),
              "data": DataKey.of(data, setup.vocab_size).model_dump(),
              "fit_sha256": hashlib.sha256(fit_py.read_bytes()).hexdigest()}
    stored = _shipped_answer(shipped, asset_key(what=what, builder_version=BUILDER_VERSION, seed=p.seed,
                                                params=params))

    def build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        if stored is not None:
            (partial / "answer.json").write_text(json.dumps(stored["answer"], indent=2) + "\n")
            (partial / "fit.json").write_text(json.dumps(stored["fit"], indent=2) + "\n")
            return {"data": str(data.path)}, {"answer": stored["answer"], "device": stored["device"],
                                              "shipped": True}
        device = device_for(spec)
        fit = _load_fit()
        runs = len(fit.design(setup, p.budget_fractions, p.widths, p.min_iters))

        def experiment(n_embd: int, max_iters: int) -> float:
            done.update(what=f"experiment n_embd={n_embd}, {max_iters} steps")
            loss = run_experiment(setup, n_embd, max_iters, data.bin_path("train"), data.bin_path("val"),
                                  seed=p.seed, device=device).loss
            done.advance()
            return loss

        threads = torch.get_num_threads()
        if device == "cpu":  # one thread: the same answer whatever the caller's setting
            torch.set_num_threads(1)
        try:
            with stage("experiments", total=runs) as done:
                report = fit.solve(setup, experiment, budget_fractions=p.budget_fractions,
                                   widths=p.widths, min_iters=p.min_iters)
        finally:
            torch.set_num_threads(threads)
        (partial / "answer.json").write_text(json.dumps(report["answer"], indent=2) + "\n")
        (partial / "fit.json").write_text(json.dumps(report, indent=2) + "\n")
        return {"data": str(data.path)}, {"answer": report["answer"], "device": device}

    cached_build(folder, what=what, builder_version=BUILDER_VERSION, seed=p.seed, params=params, build=build,
                 label=f"scaling_law {spec.name}: the reference answer"
                       + (" (shipped)" if stored is not None else ""))
    return reference_answer_path(spec, cache_dir)


def _shipped_answer(path: Path | None, key: dict[str, Any]) -> dict[str, Any] | None:
    """The shipped answer where it exists, reads and was built under `key`; else None (built here)."""
    if path is None or not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    fields = {"key", "answer", "fit", "device"}
    return stored if isinstance(stored, dict) and fields <= set(stored) and stored["key"] == key else None


def build(env: Environment, spec: TierSpec[ScalingLawParams], cache_dir: Path | None, *,
          reference: bool = True) -> Assets:
    """The tier's assets; a missing or stale ground truth stops here, before any training."""
    from openrebench.api import cache_dir as default_cache_dir

    cache = cache_dir or default_cache_dir()
    setup = spec.params.setup
    ground_truth_file(env, spec)  # before building any data
    data = data_for(spec, cache)
    _, truth = load_ground_truth(env, spec, setup, data)
    answer = (reference_answer(spec, setup, data, cache, shipped=shipped_answer_path(env.root, spec.name))
              if reference else None)
    return Assets(data=data, setup=setup, ground_truth=truth, reference_answer=answer)
