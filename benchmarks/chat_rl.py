"""chat_rl through the real scoring pipeline: how noisy a scoring is, what it costs, and how far the
reference is ahead of the start.

Sets up one run of the starting and one of the reference model (building the tier's assets first if the
cache lacks them: the models trained against the judge too), then scores each `--repeats` times,
interleaved, with the tier's judge through the gateway (`--env-model judge=...` for another). Per
scoring: the raw score (the mean of the two win rates), both win rates, judge failures, the seconds
spent sampling answers and judging, and the judge's requests and tokens on the scoring's grant. Prints
medians and spreads (the standard deviation is what the issue's noise question asks) and writes every
scoring to `--out`.

    .venv/bin/python benchmarks/chat_rl.py --tier mini --repeats 5 \\
        --out benchmarks/results/chat_rl/$(date +%F)_mini_xeon.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from scoring_runs import score_both, summarise, write

KEYS = ("raw", "win_vs_base", "win_vs_sft", "judge_failures", "seconds", "generate_s", "judge_s", "requests",
        "prompt_tokens")


def fields(details: dict[str, Any]) -> dict[str, Any]:
    return {k: details.get(k) for k in ("win_vs_base", "win_vs_sft", "judge_failures", "empty_answers",
                                        "generate_s", "judge_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--env-model", action="append", default=[], help="ROLE=MODEL, as for `eval`")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    console = Console()
    overrides = dict(pair.split("=", 1) for pair in args.env_model)
    models, scorings, setup_s = score_both("chat_rl", args.tier, args.repeats, overrides, fields, console)
    summary = summarise(scorings, KEYS)
    table = Table(title=f"chat_rl ({args.tier}), judge {models.models['judge']}")
    for col in ("solution", "valid", "raw median", "raw sd", "raw min–max", "vs base", "vs SFT", "failures",
                "seconds", "sampling s", "judging s", "judge tokens"):
        table.add_column(col, justify="right")
    for which, s in summary.items():
        if s is None:
            table.add_row(which, "0", "invalid", *[""] * 9)
            continue
        table.add_row(which, str(s["valid"]), f"{s['raw']['median']:.3f}", f"{s['raw']['sd']:.3f}",
                      f"{s['raw']['min']:.3f}–{s['raw']['max']:.3f}", f"{s['win_vs_base']['median']:.3f}",
                      f"{s['win_vs_sft']['median']:.3f}", f"{s['judge_failures']['median']:.0f}",
                      f"{s['seconds']['median']:.0f}", f"{s['generate_s']['median']:.1f}",
                      f"{s['judge_s']['median']:.1f}", f"{s['prompt_tokens']['median']:.0f}")
    console.print(table)
    if summary["start"] and summary["reference"]:
        lead = summary["reference"]["raw"]["median"] - summary["start"]["raw"]["median"]
        noise = max(summary["start"]["raw"]["sd"], summary["reference"]["raw"]["sd"])
        console.print(f"reference lead over the start: {lead:.3f} raw ({lead / noise:.1f} x the larger SD)"
                      if noise else f"reference lead over the start: {lead:.3f} raw")
    write(args.out, console, tier=args.tier, models=models.models, setup_s=setup_s, summary=summary,
          scorings=scorings)


if __name__ == "__main__":
    main()
