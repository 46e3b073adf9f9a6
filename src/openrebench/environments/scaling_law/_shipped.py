"""scaling_law's shipped data: the ground truth of a tier, computed by `openrebench build scaling_law`.

1. Sweep: for every width and seed of the tier, train at exactly the target budget and measure the
   held-out loss (each point cached, so an interrupted build resumes); the ground truth is written as
   `reference/ground_truth--<tier>.json` under the output folder.
2. Check: the reference procedure's answer (cached like every asset) and the starting answer, scored
   against the new ground truth. These raw scores are exact for it, whatever the machine; the
   tier's calibration record is still written by `openrebench calibrate scaling_law --ship`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from openrebench.api import Environment, OpenRebenchError, ShippedData, TierSpec
from openrebench.lm import load_manifest
from openrebench.runs import detect_hardware

from . import _assets
from ._ground_truth import DataKey, GroundTruth, ground_truth_path, sweep
from .env import ANSWER, starting_answer
from .scorer import read_answer, score_answer


@contextlib.contextmanager
def _one_cpu_thread(device: str) -> Iterator[None]:
    """On the CPU one thread: the same losses whatever the caller's setting (the mini ground truth
    was computed so), and tiny models train no slower."""
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _complete(path: Path, setup: Any, data: DataKey, widths: list[int],
              seeds: list[int]) -> GroundTruth | None:
    """The stored ground truth where it is the whole sweep of this setup, data, widths and seeds (it keeps
    the record of the run that made it)."""
    if not path.is_file():
        return None
    try:
        stored = GroundTruth.model_validate_json(path.read_text())
    except ValueError:
        return None
    whole = {(r.n_embd, r.seed) for r in stored.points} == {(w, s) for w in widths for s in seeds}
    return stored if stored.setup == setup and stored.data == data and whole else None


def build_shipped(env: Environment, spec: TierSpec, out_dir: Path, cache: Path, command: str) -> ShippedData:
    setup = spec.params.setup
    device = _assets.device_for(spec)
    if spec.device == "cuda" and device != "cuda":
        raise OpenRebenchError(f"scaling_law {spec.name}: the ground-truth sweep needs a CUDA GPU")
    widths, seeds = spec.params.sweep.widths, spec.params.sweep.seeds
    started = time.monotonic()
    data = _assets.data_for(spec, cache)
    path = ground_truth_path(out_dir, spec.name)
    kept = _complete(path, setup, DataKey.of(data, setup.vocab_size), widths, seeds)
    if kept is not None:  # the sweep is done: only the reference answer is (re)made below
        truth = kept
    else:
        with _one_cpu_thread(device):
            truth = sweep(spec, setup, data, cache, widths=widths, seeds=seeds, device=device,
                          command=command)
        _write_whole(path, truth.model_dump_json(indent=2) + "\n")
    sweep_s = time.monotonic() - started

    n_opt, l_opt = truth.optimum()
    lines = [f"scaling_law {spec.name}: the stored ground truth ({path.name}) covers every width and seed of "
             "the tier on this data: kept, not swept again (delete it to sweep again)"] if kept else []
    lines += [f"scaling_law {spec.name}: {len(truth.points)} points at {setup.target_flops:.3g} FLOPs on "
             f"{truth.device} ({data.kind} data); {truth.seconds:.0f} s of training and evaluation "
             f"({sweep_s:.0f} s in this call); optimum n_embd={n_opt} (held-out loss {l_opt:.4f})"]
    lines += [f"  n_embd={w:<4} max_iters={setup.max_iters_for(w, setup.target_flops):<6} "
              f"mean loss {loss:.4f}" for w, loss in truth.curve()]
    if n_opt in (min(widths), max(widths)):
        lines.append(f"WARNING: the best width ({n_opt}) is at the edge of the sweep; move the tier's range "
                     "of widths so that the optimum lies inside it")

    ref_started = time.monotonic()
    cached = _assets.reference_answer_path(spec, cache).parent
    if (old := load_manifest(cached)) is not None and old.stats.get("shipped"):
        shutil.rmtree(cached)  # a copy of the shipped answer: this command runs the procedure itself
    answer_path = _assets.reference_answer(spec, setup, data, cache)
    reference_s = time.monotonic() - ref_started
    manifest = load_manifest(answer_path.parent)
    assert manifest is not None
    shipped_answer = _assets.shipped_answer_path(out_dir, spec.name)
    _write_whole(shipped_answer, json.dumps({
        "key": manifest.key(), "answer": json.loads(answer_path.read_text()),
        "fit": json.loads((answer_path.parent / "fit.json").read_text()), "device": manifest.stats["device"],
        "command": command, "hardware": detect_hardware().model_dump(),
        "build_seconds": manifest.build_seconds}, indent=2) + "\n")
    scores: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="scaling-law-start-") as tmp:
        (Path(tmp) / ANSWER).write_text(json.dumps(starting_answer(spec.params), indent=2) + "\n")
        for which, folder in (("start", Path(tmp)), ("reference", answer_path.parent)):
            answer = read_answer(folder, setup)
            if isinstance(answer, str):
                raise OpenRebenchError(f"scaling_law {spec.name}: the {which} answer is invalid: {answer}")
            raw, parts = score_answer(answer, truth)
            scores[which] = {"raw": raw, "answer": answer.model_dump(), **parts}
            lines.append(f"{which} answer {answer.model_dump()}: raw {raw:.4f} (L_interp "
                         f"{parts['l_interp']:.4f}, prediction error {parts['prediction_error']:.4f})")
    reference_build_s = manifest.build_seconds
    lines.append(f"reference procedure: {reference_build_s:.0f} s ({reference_s:.0f} s in this call); the "
                 f"raw scores above are exact for this ground truth (`openrebench calibrate scaling_law "
                 f"--tier {spec.name} --repeats 1 --ship` records them)")
    summary = {"tier": spec.name, "hardware": detect_hardware().model_dump(), "sweep_seconds": truth.seconds,
               "sweep_seconds_this_call": sweep_s, "reference_seconds": reference_build_s,
               "reference_seconds_this_call": reference_s, "curve": truth.curve(), "optimum": [n_opt, l_opt],
               "scores": scores}
    return ShippedData(files=[path, shipped_answer], lines=lines, summary=summary)


def _write_whole(path: Path, text: str) -> None:
    """Whole or not at all: an interrupted write leaves the shipped file as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
