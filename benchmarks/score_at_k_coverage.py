"""How often the 95% percentile-bootstrap interval of score@k covers the true value, by runs per
environment (n) and k, on score distributions shaped like RE-Bench's (a spike at 0, a bounded bump, a
long right tail; three environments averaged). Also the relative bias of the exact plug-in estimate.

The truth is the expected best of k draws from each full population (10,000 values); each simulated
study draws n runs per environment and computes score@k and its interval as `openrebench analyze` does.

    .venv/bin/python benchmarks/score_at_k_coverage.py --studies 1000 \
        --out benchmarks/results/score_at_k_coverage/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from openrebench.analysis import expected_max, score_at_k
from openrebench.runs import detect_hardware


def populations(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"spiky": np.concatenate([np.zeros(4000), rng.beta(2, 5, 6000)]),
            "tail": rng.gamma(2.0, 0.3, 10_000), "flat": rng.uniform(0, 1, 10_000)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--boots", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    pop = populations(rng)
    rows = []
    started = time.perf_counter()
    print(f"{'n':>4} {'k':>4} {'coverage':>9} {'rel. bias':>10}")
    for n in (10, 20, 40, 80):
        for k in (1, 2, 4, 8, 16):
            truth = float(np.mean([expected_max(v, k) for v in pop.values()]))
            covered = 0
            estimates = []
            for study in range(args.studies):
                sample = {env: rng.choice(v, size=n) for env, v in pop.items()}
                est, _ = score_at_k(sample, k, set(), sims=10, boots=args.boots, seed=study)
                covered += est.ci_low <= truth <= est.ci_high
                estimates.append(est.exact)
            row = {"n": n, "k": k, "truth": truth, "coverage": covered / args.studies,
                   "relative_bias": float(np.mean(estimates)) / truth - 1}
            rows.append(row)
            print(f"{n:>4} {k:>4} {row['coverage']:>9.3f} {row['relative_bias']:>+10.3f}")
    result = {"command": shlex.join([os.path.relpath(sys.executable), *sys.argv]),
              "machine": platform.platform(), "cpu": detect_hardware().cpu_model, "studies": args.studies,
              "boots": args.boots, "seed": args.seed, "level": 0.95,
              "seconds": round(time.perf_counter() - started, 1), "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
