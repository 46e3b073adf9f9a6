"""How fast chat_rl's `chat_lm.generate` samples answers (what the scorer and both pipelines spend their
GPU time on), for a model of GPT-2's shape at the full tier's settings.

A randomly initialised GPT-2 (12 layers, 768 wide, 512 positions) answers `--n` held-out-style
instructions with 60 new tokens (it rarely ends early, so this is the worst case), once per batch size;
`--baseline PATH` times another chat_lm.py (an older version) the same way, interleaved, and checks that
both give the same answers. Medians of `--repeats`; prints a table and writes JSON.

    python3 benchmarks/chat_rl_sampling.py --device cuda --baseline old_chat_lm.py \\
        --out benchmarks/results/chat_rl_sampling/$(date +%F)_h200.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from openrebench.api import cache_dir
from openrebench.environments.chat_rl import chat_lm
from openrebench.lm import gpt2_hf_tokenizer


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_chat_lm", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--batch-sizes", default="64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=512)).to(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.json").write_text(gpt2_hf_tokenizer(cache_dir()).to_str())
        tokenizer = chat_lm.ChatTokenizer(Path(tmp))
    instructions = [f"Define the word number {i} of the list, in one sentence." for i in range(args.n)]
    versions: dict[str, Any] = {"current": chat_lm}
    if args.baseline:
        versions["baseline"] = load(args.baseline)
    rows: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        times: dict[str, list[float]] = {name: [] for name in versions}
        answers: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for name, module in versions.items():
                if args.device == "cuda":
                    torch.cuda.synchronize()
                started = time.monotonic()
                answers[name] = module.generate(model, tokenizer, instructions, max_new_tokens=60,
                                                seed=3, batch_size=batch)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.monotonic() - started)
        for name in versions:
            median = statistics.median(times[name])
            rows.append({"version": name, "batch_size": batch, "seconds": times[name],
                         "median_s": median, "answers_per_s": args.n / median,
                         "same_answers_as_current": answers[name] == answers["current"]})
    print(f"{'version':<10} {'batch':>6} {'median s':>9} {'answers/s':>10} {'same':>5}")
    for r in rows:
        print(f"{r['version']:<10} {r['batch_size']:>6} {r['median_s']:>9.2f} {r['answers_per_s']:>10.1f} "
              f"{r['same_answers_as_current']!s:>5}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": shlex.join(["python3", *sys.argv]), "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "torch": torch.__version__, "n": args.n, "rows": rows}, indent=1) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
