"""Where chat_rl mini's scoring noise comes from, and whether two cheap changes would remove it.

A chat_rl scoring samples one answer per held-out instruction (temperature 0.7, a fresh seed) and counts
how often the likelihood judge prefers it to the base model's and the SFT model's stored answer (one each,
drawn once at set-up). The reference's raw score moves by about 0.02-0.03 from one scoring to the next
(0.06-0.09 normalised). This study scores the trained start and reference models of the cache (the
models trained against the offline judge: `benchmarks/chat_rl.py` builds them) with the judge in this
process (the gateway's `Likelihood`, the same weights and arithmetic), and compares:

- sampled answers, `--seeds` seeds, against the stored answers: the noise the tier has;
- the same answers against `--k` stored answers per reference model instead of one (each preference
  averaged over the k): whether the stored side carries the noise;
- greedy answers (no sampling noise at all), against the stored answers and against greedy stored
  answers: whether a deterministic scorer keeps the reference's lead.

Prints a table (mean and standard deviation over seeds) and writes every score as JSON.

    .venv/bin/python benchmarks/chat_rl_noise_study.py \\
        --out benchmarks/results/studies/$(date +%F)_chat_rl_noise_<machine>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.table import Table

from openrebench.api import cache_dir
from openrebench.environments.chat_rl import chat_lm, evaluation
from openrebench.environments.chat_rl.env import MINI
from openrebench.environments.chat_rl.scorer import _win_rate, load_submission
from openrebench.gateway._likelihood import Likelihood
from openrebench.lm import assets_root
from openrebench.runs import detect_hardware


class _Echo:
    """The completions endpoint's echo, answered in this process (what the gateway does for `local`)."""

    def __init__(self) -> None:
        self.likelihood = Likelihood()

    async def create(self, **body: Any) -> Any:
        out = self.likelihood.echo(list(body["prompt"]))
        return SimpleNamespace(choices=[SimpleNamespace(index=i, logprobs=SimpleNamespace(**o))
                                        for i, o in enumerate(out)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="sampled scorings of each model")
    parser.add_argument("--k", type=int, default=4, help="stored answers per reference model")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    p = MINI
    lm = assets_root(cache_dir())
    judged = lm / "chatrl-mini-judged-local"
    if not (judged / "manifest.json").is_file():
        sys.exit("error: no chat_rl mini models trained against the offline judge in the cache; "
                 "run benchmarks/chat_rl.py --tier mini first")
    client = SimpleNamespace(completions=_Echo())
    rows = chat_lm.read_jsonl(lm / "chatrl-mini-answers" / "heldout.jsonl")
    prompts = [r["instruction"] for r in rows]
    config = json.loads((lm / "chatrl-mini-base" / "config.json").read_text())
    tokenizer = chat_lm.ChatTokenizer(lm / "chatrl-mini-tokenizer")

    def answers(model: Any, seed: int, greedy: bool = False) -> list[str]:
        return chat_lm.generate(model, tokenizer, prompts, max_new_tokens=p.max_new_tokens,
                                temperature=0 if greedy else p.temperature, top_k=p.top_k, seed=seed)

    def judged_scores(texts: list[str]) -> list[float | None]:
        return asyncio.run(evaluation.likelihood_scores(client, list(zip(prompts, texts, strict=True)),
                                                        rejected=-math.inf))

    def raw(ours: list[float | None], theirs: dict[str, list[list[float | None]]]) -> float:
        """The scorer's mean of the two win rates (`_win_rate`: comparisons the judge failed are left
        out), each preference averaged over the stored answers given."""
        rates = []
        for stored in theirs.values():
            prefs = [[evaluation.preference(a, t[i]) for t in stored] for i, a in enumerate(ours)]
            rate, _ = _win_rate([None if None in x else statistics.fmean(x) for x in prefs])  # type: ignore[arg-type]
            assert rate is not None, "the judge failed on every comparison"
            rates.append(rate)
        return sum(rates) / len(rates)

    started = time.monotonic()
    stored: dict[str, list[list[float | None]]] = {}
    greedy_stored: dict[str, list[list[float | None]]] = {}
    for name in ("base", "sft"):
        model = load_submission(lm / f"chatrl-mini-{name}", config, "cpu")
        stored[name] = [judged_scores(answers(model, 1000 + k)) for k in range(args.k)]
        greedy_stored[name] = [judged_scores(answers(model, 0, greedy=True))]
        print(f"{name}: {args.k} sampled answer sets and the greedy one judged", flush=True)
    results: dict[str, Any] = {}
    for which in ("start", "reference"):
        model = load_submission(judged / which, config, "cpu")
        one, k_sets = [], []
        for seed in range(1, args.seeds + 1):
            ours = judged_scores(answers(model, seed))
            one.append([raw(ours, {n: [s[j]] for n, s in stored.items()}) for j in range(args.k)])
            k_sets.append(raw(ours, stored))
            print(f"{which} seed {seed}: one stored answer {[round(x, 3) for x in one[-1]]}, "
                  f"{args.k} stored answers {k_sets[-1]:.3f}", flush=True)
        greedy = judged_scores(answers(model, 0, greedy=True))
        results[which] = {
            "sampled_one_stored": one, "sampled_k_stored": k_sets,
            "greedy_vs_sampled_stored": raw(greedy, {n: [s[0]] for n, s in stored.items()}),
            "greedy_vs_greedy_stored": raw(greedy, greedy_stored),
            # Over seeds, for each stored answer set in turn, then averaged: the spread a scoring has.
            "sd_one_stored": statistics.fmean(statistics.stdev(row[j] for row in one) for j in range(args.k)),
            "sd_k_stored": statistics.stdev(k_sets),
            "mean_one_stored": statistics.fmean(x for row in one for x in row),
            "mean_k_stored": statistics.fmean(k_sets),
        }
    empty = {n: sum(1 for s in sets[0] if s == -math.inf) for n, sets in greedy_stored.items()}
    table = Table(title=f"chat_rl mini: raw score by how answers are drawn and compared ({args.seeds} seeds)")
    for column in ("model", "sampled, 1 stored (sd)", f"sampled, {args.k} stored (sd)",
                   "greedy vs sampled stored", "greedy vs greedy stored"):
        table.add_column(column)
    for which, r in results.items():
        table.add_row(which, f"{r['mean_one_stored']:.3f} ({r['sd_one_stored']:.3f})",
                      f"{r['mean_k_stored']:.3f} ({r['sd_k_stored']:.3f})",
                      f"{r['greedy_vs_sampled_stored']:.3f}", f"{r['greedy_vs_greedy_stored']:.3f}")
    Console().print(table)
    lead = {k: results["reference"][k] - results["start"][k] for k in
            ("mean_one_stored", "greedy_vs_sampled_stored", "greedy_vs_greedy_stored")}
    print(f"reference lead: sampled {lead['mean_one_stored']:.3f}, greedy "
          f"{lead['greedy_vs_sampled_stored']:.3f} (vs sampled stored), "
          f"{lead['greedy_vs_greedy_stored']:.3f} (vs greedy stored); greedy stored answers empty: {empty}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": f"python benchmarks/chat_rl_noise_study.py --seeds {args.seeds} --k {args.k}",
        "hardware": detect_hardware().model_dump(), "seconds": round(time.monotonic() - started),
        "results": results, "reference_lead": lead, "greedy_stored_empty": empty,
        "n_prompts": len(prompts)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
