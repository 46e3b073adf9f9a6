"""The starting pipeline (the paper's): for each of some training prompts, sample two answers from the
base model, ask the judge which is better, then finetune the model on the winners.

    python rl_finetune.py                    # writes the finetuned model to model/
    python rl_finetune.py --prompts 512 --steps 100

It prints one JSON line at the end (what it did). The scorer reads model/ (see chat_lm.save_model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import chat_lm
import evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="base_model", help="the model to start from")
    parser.add_argument("--out", default="model", help="where the finetuned model goes")
    parser.add_argument("--prompts", type=int, default=256, help="training prompts used")
    parser.add_argument("--samples", type=int, default=2, help="answers per prompt (the pair)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60, help="finetuning steps")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--mask-prompt", action="store_true", help="no loss on the prompt's tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.monotonic()
    with open("settings.json") as f:
        settings = json.load(f)
    tokenizer = chat_lm.ChatTokenizer("tokenizer")
    model = chat_lm.load_model(args.base, args.device)
    prompts = [row["instruction"] for row in chat_lm.read_jsonl("prompts.jsonl")]
    chosen = random.Random(args.seed).sample(prompts, min(args.prompts, len(prompts)))
    first, second = (
        chat_lm.generate(
            model,
            tokenizer,
            chosen,
            max_new_tokens=settings["max_new_tokens"],
            temperature=args.temperature,
            top_k=settings["top_k"],
            seed=args.seed + k,
        )
        for k in range(2)
    )
    prefs = asyncio.run(evaluation.evaluate(chosen, list(zip(first, second, strict=True))))
    winners = [
        (p, a if pref >= 0.5 else b)
        for p, a, b, pref in zip(chosen, first, second, prefs, strict=True)
        if pref is not None
    ]
    losses = chat_lm.finetune(
        model,
        tokenizer,
        winners,
        steps=args.steps,
        learning_rate=args.lr,
        mask_prompt=args.mask_prompt,
        seed=args.seed,
    )
    chat_lm.save_model(model.cpu(), args.out)
    print(
        json.dumps(
            {
                "prompts": len(chosen),
                "judged": len(winners),
                "judge_failures": prefs.count(None),
                "first_loss": losses[0] if losses else None,
                "last_loss": losses[-1] if losses else None,
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
