"""Train one model with this task's fixed setup and report its validation loss.

    python train.py --n_embd 16 --max_iters 500            # one experiment
    python train.py --n_embd 16 --flops 2e10               # max_iters chosen to spend 2e10 FLOPs
    python train.py --n_embd 16 --max_iters 500 --dry-run  # FLOPs and parameters only

Only n_embd and max_iters vary; everything else is fixed in setup.json (depth, head size, context,
batch, learning-rate schedule) and in data/. The training code is
openrebench.environments.scaling_law.experiment, the same code that produced the ground truth.
FLOPs = (6·N + 12·n_layer·n_embd·block_size) · max_iters · batch_size · block_size, with N the
parameters except the position embeddings. Runs over the per-experiment cap are refused. Every
result is printed and appended to results.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from openrebench.environments.scaling_law.experiment import OverCap, Setup, run_experiment

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n_embd", type=int, required=True)
    steps = parser.add_mutually_exclusive_group(required=True)
    steps.add_argument("--max_iters", type=int)
    steps.add_argument("--flops", type=float, help="spend this many FLOPs (sets max_iters)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    setup = Setup.model_validate_json((HERE / "setup.json").read_text())
    problem = setup.width_problem(args.n_embd)
    if problem:
        raise SystemExit(problem)
    max_iters = args.max_iters or setup.max_iters_for(args.n_embd, args.flops)
    flops = setup.flops(args.n_embd, max_iters)
    info = {"n_embd": args.n_embd, "max_iters": max_iters, "flops": flops,
            "params": setup.params(args.n_embd), "tokens": max_iters * setup.tokens_per_iter,
            "cap_flops": setup.cap_flops}
    if args.dry_run:
        print(json.dumps(info))
        return
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        result = run_experiment(setup, args.n_embd, max_iters, HERE / "data" / "train.bin",
                                HERE / "data" / "val.bin", seed=args.seed, device=device)
    except OverCap as e:
        raise SystemExit(f"refused: {e}") from None
    line = result.model_dump_json()
    print(line)
    with open(HERE / "results.jsonl", "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
