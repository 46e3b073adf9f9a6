"""Run your scaffold on a problem file and judge its programs as the scorer does.

    python evaluate.py data/valid.jsonl solve_code_contests_rust [--limit N] [--concurrency C] [--verbose]

The scorer calls `generate_solution` on the held-out problems in batches, each problem given without
its hidden tests (`private_tests`, `generated_tests`), then compiles each answer with rustc (edition
2018) and runs it on all of the problem's tests; this does the same on the file you name, with the
Rust utilities of rust_codecontests_utils/ (a copy of the scorer's: editing it changes nothing but
this script). Model calls go through the gateway (OPENAI_BASE_URL, OPENAI_API_KEY) and count against
your budget.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rust_codecontests_utils as rcu
from openai import AsyncOpenAI

HIDDEN = ("private_tests", "generated_tests")


async def one(module: Any, client: AsyncOpenAI, semaphore: asyncio.Semaphore, problem: dict[str, Any],
              timeout_s: float, verbose: bool) -> bool:
    public = {k: v for k, v in problem.items() if k not in HIDDEN}
    try:
        source = await asyncio.wait_for(module.generate_solution(client, semaphore, public), timeout_s)
    except Exception as e:
        print(f"{problem['name']}: generate_solution raised {type(e).__name__}: {e}")
        return False
    if not isinstance(source, str):
        print(f"{problem['name']}: generate_solution returned {type(source).__name__}, not str")
        return False
    with tempfile.TemporaryDirectory() as workdir:
        result = await rcu.evaluate_problem(source, problem, workdir=Path(workdir))
    print(f"{problem['name']}: {'solved' if result.solved else result.summary()}")
    if verbose and not result.solved:
        print("  " + source[:2000].replace("\n", "\n  "))
    return result.solved


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", type=Path, help="a JSONL file of problems (data/valid.jsonl)")
    parser.add_argument("module", help="the scaffold's module name (solve_code_contests_rust)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--concurrency", type=int, default=4, help="the semaphore's value")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per problem")
    parser.add_argument("--verbose", action="store_true", help="print the programs that fail")
    args = parser.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    module = importlib.import_module(args.module.removesuffix(".py"))
    problems = [json.loads(line) for line in args.problems.read_text().splitlines() if line.strip()]
    problems = problems[:args.limit] if args.limit else problems
    client, semaphore = AsyncOpenAI(), asyncio.Semaphore(args.concurrency)
    t0 = time.monotonic()
    solved = await asyncio.gather(*(one(module, client, semaphore, p, args.timeout, args.verbose)
                                    for p in problems))
    n, k = len(problems), sum(solved)
    se = (k / n * (1 - k / n) / n) ** 0.5 if n else 0.0
    print(json.dumps({"n_successes": k, "n_problems": n, "score": k / n if n else 0.0,
                      "standard_error": round(se, 4), "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    asyncio.run(main())
