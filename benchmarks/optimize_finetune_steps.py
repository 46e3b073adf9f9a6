"""optimize_finetune: where a training step's time goes, for variants of the reference's step.

Loads the tier's initial model and a draw of its records once, then times optimizer steps (after
warm-up) for each variant: micro-batches as configured or the whole global batch in one pass
(token-weighted, so the loss is the same), records in data order or grouped by length, sdpa or eager
attention, TF32 on or off. A bf16-weights variant (not the same computation) shows the ceiling.
With `--profile`, the top CUDA kernels of one step of the reference's variant.

    python benchmarks/optimize_finetune_steps.py --tier full --steps 6 --profile \\
        --out benchmarks/results/optimize_finetune_steps/$(date +%F)_full_h200.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from openrebench.api import cache_dir
from openrebench.environments.optimize_finetune._assets import build
from openrebench.runs import detect_hardware, get_environment


def reference_module() -> Any:
    env = get_environment("optimize_finetune")
    spec = importlib.util.spec_from_file_location("ref_finetune", env.root / "reference" / "finetune.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def groups(batch: list[int], samples: list[tuple[list[int], int]], micro: int,
           by_length: bool) -> list[list[int]]:
    order = sorted(batch, key=lambda i: len(samples[i][0])) if by_length else list(batch)
    return [order[i:i + micro] for i in range(0, len(order), micro)]


def step(model: Any, ref: Any, samples: list, batch: list[int], micro: int, pass_size: int | str,
         by_length: bool, pad_id: int, amp: Any, device: torch.device, limit: int) -> None:
    """One optimizer step's forward/backward passes: the loss of each configured micro-batch (mean over
    its labelled tokens, weighted by its share of the records) summed, computed `pass_size` records at
    a time through per-token weights (`"packed"`: the reference's own packing by padded tokens)."""
    if pass_size == "packed":
        passes = ref.weighted_passes(batch, samples, micro, ref.pass_budget(device))
        multiple, width_limit = ref.WIDTH_MULTIPLE, limit
    else:
        weight = ref.record_weights(batch, samples, micro)
        passes = [(members, [weight[i] for i in members])
                  for members in groups(batch, samples, int(pass_size), by_length)]
        multiple, width_limit = 1, None
    for members, weights in passes:
        part = ref.collate([samples[i] for i in members], pad_id, multiple, width_limit)
        part = {k: v.to(device, non_blocking=True) for k, v in part.items()}
        with amp:
            loss = ref.weighted_loss(model, part, weights)
        loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="full")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = get_environment("optimize_finetune")
    spec = env.tier(args.tier)
    assets = build(spec, cache_dir())
    ref = reference_module()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(assets.tokenizer))
    pool = assets.pool.read_text().splitlines()
    records = random.Random(0).sample(pool, spec.params.records)
    data = Path("/tmp/oft_steps_data.jsonl")
    data.write_text("\n".join(records) + "\n")
    cfg = {"max_seq_len": spec.params.config.max_seq_len, "data": {"path": str(data)}}
    samples = ref.tokenize(cfg, tokenizer)
    lengths = [len(ids) for ids, _ in samples]
    print(f"{len(samples)} records, tokens: mean {statistics.mean(lengths):.0f}, max {max(lengths)}")
    global_batch = spec.params.config.global_train_batch_size
    micro = spec.params.config.device_train_microbatch_size
    batches = ref.global_batches(len(samples), global_batch, 0, 0, True, True)
    pad_id = tokenizer.eos_token_id

    variants: list[dict[str, Any]] = [
        {"name": "micro-batches as configured", "pass": micro},
        {"name": "the reference: by length, packed", "pass": "packed", "tf32": True},
        {"name": "+ TF32", "pass": micro, "tf32": True},
        {"name": "whole global batch per pass", "pass": global_batch},
        {"name": "grouped by length, micro-batch passes", "pass": micro, "by_length": True},
        {"name": "grouped by length, 8 per pass", "pass": 8, "by_length": True},
        {"name": "eager attention", "pass": micro, "attn": "eager"},
        {"name": "bf16 weights (ceiling, not the same maths)", "pass": micro, "dtype": torch.bfloat16},
    ]
    results: dict[str, Any] = {"command": "python " + " ".join(__import__("sys").argv),
                               "hardware": detect_hardware().model_dump(mode="json"),
                               "records_tokens_mean": statistics.mean(lengths), "variants": []}
    print(f"{'variant':<48} {'ms/step':>9} {'tokens/s':>10}")
    for v in variants:
        torch.backends.cuda.matmul.allow_tf32 = bool(v.get("tf32"))
        model = AutoModelForCausalLM.from_pretrained(
            str(assets.initial_model), dtype=v.get("dtype", torch.float32),
            attn_implementation=v.get("attn", "sdpa")).to(device)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.0, fused=device.type == "cuda")
        amp = torch.autocast(device.type, dtype=torch.bfloat16)
        times, tokens = [], 0
        for n in range(args.steps + 2):
            batch = batches[n % len(batches)]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            step(model, ref, samples, batch, micro, v["pass"], bool(v.get("by_length")), pad_id, amp, device,
                 cfg["max_seq_len"])
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if n >= 2:
                times.append(time.perf_counter() - t0)
                tokens += sum(lengths[i] for i in batch)
        ms = 1000 * statistics.median(times)
        row = {**{k: str(x) for k, x in v.items()}, "ms_per_step": ms, "tokens_per_s": tokens / sum(times),
               "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else None}
        results["variants"].append(row)
        print(f"{v['name']:<48} {ms:>9.1f} {row['tokens_per_s']:>10.0f}", flush=True)
        if args.profile and v is variants[1]:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step(model, ref, samples, batches[0], micro, "packed", False, pad_id, amp, device,
                     cfg["max_seq_len"])
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
            print(table)
            results["profile"] = table
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
