"""The ground truth of scaling_law for a tier: a sweep of widths at the target budget, then the
reference answer and the start and reference raw scores it implies.

1. Sweep: for every width and seed of the tier, train at exactly the target budget (max_iters from
   the FLOP formula) and measure the held-out loss. Each point is cached, so an interrupted sweep
   resumes. The result goes to the environment (`reference/ground_truth--<tier>.json`) and, with
   `--copy-to`, to a folder of your choice (for a machine whose checkout does not come back).
2. Reference: the reference procedure runs its own grid under the per-experiment cap and fits a
   scaling law (cached, like every asset).
3. Raw scores of the starting and the reference answers, which the ground truth fixes exactly; with
   `--record-dir` also a calibration record of them (`benchmarks/lm_environment.py scaling_law`
   measures the same through the real scoring pipeline).

    python benchmarks/scaling_law_sweep.py --tier mini --threads 1 \
        --out benchmarks/results/scaling_law_mini_xeon.json
    python benchmarks/scaling_law_sweep.py --tier full --out $OUT/scaling_law_full_h200.json \
        --copy-to $OUT --record-dir $OUT                                  # one H200
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from openrebench.api import cache_dir, show_progress
from openrebench.environments.scaling_law import _assets
from openrebench.environments.scaling_law._ground_truth import GroundTruth, ground_truth_path, sweep
from openrebench.environments.scaling_law.env import ANSWER
from openrebench.environments.scaling_law.experiment import Result, Setup
from openrebench.environments.scaling_law.scorer import read_answer, score_answer
from openrebench.lm import load_manifest
from openrebench.runs import calibrate, detect_hardware, get_environment, place, save_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the tier's")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="write a summary (JSON) here")
    parser.add_argument("--copy-to", type=Path, help="also write the ground truth into this folder")
    parser.add_argument("--record-dir", type=Path, help="write a calibration record here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    env = get_environment("scaling_law")
    spec = env.tier(args.tier)
    setup = Setup(**spec.params["setup"])
    cache = cache_dir()
    command = " ".join(["python", *sys.argv])
    device = _assets.device_for(spec)
    if spec.device == "cuda" and device != "cuda":
        raise SystemExit(f"the {spec.name} tier's sweep needs a CUDA GPU")
    started = time.monotonic()
    data = _assets.data_for(spec, cache)
    widths, seeds = spec.params["sweep"]["widths"], args.seeds or spec.params["sweep"]["seeds"]
    total, done = len(widths) * len(seeds), 0
    print(f"scaling_law {spec.name}: {total} points at {setup.target_flops:.3g} FLOPs on {device} "
          f"({data.kind}, {data.num_tokens('train'):,} training tokens)", flush=True)

    def on_point(r: Result, fresh: bool) -> None:
        nonlocal done
        done += 1
        elapsed = time.monotonic() - started
        print(f"  [{done}/{total}] n_embd={r.n_embd:<4} seed={r.seed} max_iters={r.max_iters:<6} "
              f"tokens={r.tokens / data.num_tokens('train'):5.2f} epochs  held-out loss {r.loss:.4f}  "
              f"{r.seconds:6.1f} s{'' if fresh else ' (cached)'}  [{elapsed:.0f} s so far]", flush=True)

    truth = sweep(spec, setup, data, cache, widths=widths, seeds=seeds, device=device, command=command,
                  on_point=on_point)
    sweep_s = time.monotonic() - started
    path = ground_truth_path(env.root, spec.name)
    stored = GroundTruth.model_validate_json(path.read_text()) if path.is_file() else None
    if stored is not None and (stored.setup, stored.data, stored.points) == (truth.setup, truth.data,
                                                                              truth.points):
        truth = stored  # the same sweep (every point cached): keep the record of the run that made it
    text = truth.model_dump_json(indent=2) + "\n"
    path.write_text(text)
    n_opt, l_opt = truth.optimum()
    print(f"sweep: {truth.seconds:.0f} s of training and evaluation ({sweep_s:.0f} s in this call); "
          f"optimum n_embd={n_opt} (loss {l_opt:.4f}); written to {path}")
    for w, loss in truth.curve():
        iters = setup.max_iters_for(w, setup.target_flops)
        print(f"  n_embd={w:<4} max_iters={iters:<6} mean loss {loss:.4f}")
    if n_opt in (min(widths), max(widths)):
        print(f"WARNING: the best width ({n_opt}) is at the edge of the sweep; the tier's range of widths "
              "should be moved so that the optimum lies inside it")

    ref_started = time.monotonic()
    answer_path = _assets.reference_answer(spec, setup, data, cache)
    reference_s = time.monotonic() - ref_started
    manifest = load_manifest(answer_path.parent)
    reference_build_s = manifest.build_seconds if manifest else reference_s
    scores = {}
    with tempfile.TemporaryDirectory() as tmp:
        start_ws = Path(tmp) / "start"
        place([p for p in env.files(spec.name, cache).workspace if p.dest == ANSWER], start_ws)
        for which, folder in (("start", start_ws), ("reference", answer_path.parent)):
            answer = read_answer(folder, setup)
            assert not isinstance(answer, str), f"the {which} answer is invalid: {answer}"
            raw, parts = score_answer(answer, truth)
            scores[which] = {"raw": raw, "answer": answer.model_dump(), **parts}
            print(f"{which:<10} {answer.model_dump()}  raw {raw:.4f}  (L_interp {parts['l_interp']:.4f}, "
                  f"prediction error {parts['prediction_error']:.4f})")
    print(f"reference procedure: {reference_build_s:.0f} s ({reference_s:.0f} s in this call)")
    summary = {"command": command, "tier": spec.name, "hardware": detect_hardware().model_dump(),
               "sweep_seconds": truth.seconds, "sweep_seconds_this_call": sweep_s,
               "reference_seconds": reference_build_s, "reference_seconds_this_call": reference_s,
               "curve": truth.curve(), "optimum": [n_opt, l_opt], "scores": scores}
    if args.record_dir:  # the raw scores are exact given the ground truth: no repeated scorings needed
        record = calibrate(env, spec.name, 1, score_once=lambda which: (scores[which]["raw"], "exact"),
                           command=command)
        print(f"calibration record: {save_record(record, args.record_dir)}")
        summary["calibration"] = record.model_dump(mode="json")
    if args.copy_to:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        (args.copy_to / path.name).write_text(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    with show_progress():
        main()
