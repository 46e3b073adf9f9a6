"""The reference pipeline: rounds of best-of-n with the judge. Each round samples `--samples` answers
(8) to fresh training prompts, keeps the winner of a single-elimination tournament judged in pairs,
and finetunes the model on the winners with the prompt's tokens masked out of the loss; the next round
samples from the finetuned model.

    python rl_finetune.py --prompts 96 --samples 8 --rounds 2 --steps 80 --mask-prompt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import chat_lm
import evaluation


async def tournament(prompts: list[str], answers: list[list[str]]) -> list[str | None]:
    """The winner of each prompt's answers, judged in pairs, round by round (all prompts at once)."""
    alive = [list(a) for a in answers]
    while any(len(a) > 1 for a in alive):
        flat_prompts, pairs, where = [], [], []
        for i, cands in enumerate(alive):
            for j in range(0, len(cands) - 1, 2):
                flat_prompts.append(prompts[i])
                pairs.append((cands[j], cands[j + 1]))
                where.append(i)
        prefs = await evaluation.evaluate(flat_prompts, pairs)
        nxt: list[list[str]] = [[] for _ in alive]
        for (a, b), pref, i in zip(pairs, prefs, where, strict=True):
            nxt[i].append(a if pref is None or pref >= 0.5 else b)
        for i, cands in enumerate(alive):
            if len(cands) % 2 == 1:
                nxt[i].append(cands[-1])  # a bye
            if len(cands) <= 1:
                nxt[i] = cands
        alive = nxt
    return [a[0] if a else None for a in alive]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="base_model")
    parser.add_argument("--out", default="model")
    parser.add_argument("--prompts", type=int, default=96, help="training prompts per round")
    parser.add_argument("--samples", type=int, default=8, help="answers per prompt")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=80, help="finetuning steps per round")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--mask-prompt", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.monotonic()
    with open("settings.json") as f:
        settings = json.load(f)
    tokenizer = chat_lm.ChatTokenizer("tokenizer")
    model = chat_lm.load_model(args.base, args.device)
    prompts = [row["instruction"] for row in chat_lm.read_jsonl("prompts.jsonl")]
    random.Random(args.seed).shuffle(prompts)
    log = []
    for r in range(args.rounds):
        chosen = [prompts[(r * args.prompts + i) % len(prompts)] for i in range(args.prompts)]
        samples = [
            chat_lm.generate(
                model,
                tokenizer,
                chosen,
                max_new_tokens=settings["max_new_tokens"],
                temperature=args.temperature,
                top_k=settings["top_k"],
                seed=args.seed + 100 * r + k,
            )
            for k in range(args.samples)
        ]
        per_prompt = [[s[i] for s in samples] for i in range(len(chosen))]
        winners = asyncio.run(tournament(chosen, per_prompt))
        examples = [(p, w) for p, w in zip(chosen, winners, strict=True) if w]
        losses = chat_lm.finetune(
            model,
            tokenizer,
            examples,
            steps=args.steps,
            learning_rate=args.lr,
            mask_prompt=args.mask_prompt,
            seed=args.seed + r,
        )
        log.append({"round": r, "examples": len(examples), "last_loss": losses[-1] if losses else None})
    chat_lm.save_model(model.cpu(), args.out)
    print(json.dumps({"rounds": log, "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
