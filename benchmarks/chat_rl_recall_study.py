"""Can chat_rl's mini base model hold facts it read in pretraining, and state them once finetuned to answer?

chat_rl's mini judge cannot tell an answer to the question from one that ignores it, because no mini model's
answer carries evidence of its question: a held-out word's definition was read once, if at all, in
pretraining, and the 4-layer, 128-wide model does not recall it (docs/threat-model.md, invariant 4). In the
paper GPT-2 had read the web, and the instructions ask about what it read. This study measures the mini
analogue: the tier's base model (its shape, corpus, steps, batch and learning rate) pretrained with the
dictionary entries of some words repeated in its stream ("Lantern (noun): Something inclosing a light..."),
then finetuned as the SFT reference is, on demonstrations for some of those words only. Words:

- `probe`: entry repeated in pretraining, never asked about in finetuning (as held-out words would be);
- `taught`: entry repeated, and its demonstration in the finetuning (as training words would be);
- `control`: neither (as held-out words are now).

Measured for probe and control words, each against three other words' glosses of its own group (chance
0.25): A, the base model's choice of the word's own gloss after its entry's head ("Lantern (noun):"); B, the
finetuned model's choice after the question ('What does the word "lantern" mean?' in the Alpaca format);
C, whether its greedy answer shares more content words with its own gloss than with any of the three.
An arm with no repetition (the tier's base as it is) is the baseline.

    .venv/bin/python benchmarks/chat_rl_recall_study.py \\
        --out benchmarks/results/studies/$(date +%F)_chat_rl_recall_<machine>.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from openrebench.base import cache_dir
from openrebench.environments.chat_rl import chat_lm
from openrebench.environments.chat_rl.env import MINI
from openrebench.lm import (
    GPT,
    GPTConfig,
    build_corpus,
    compact_corpus,
    first_sense,
    gcide_entries,
    gcide_root,
    gpt2_hf_tokenizer,
)

QUESTION = 'What does the word "{w}" mean?'
STOP = {"a", "an", "the", "of", "or", "to", "in", "on", "and", "by", "for", "with", "as", "is", "be", "that",
        "which", "from", "at", "its", "it", "any", "one"}


def _tokenizer(folder: Path, vocab: Path) -> chat_lm.ChatTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(gpt2_hf_tokenizer().to_str())
    (folder / "compact.json").write_text(vocab.read_text())
    return chat_lm.ChatTokenizer(folder)


def _words(tok: chat_lm.ChatTokenizer, n: int, seed: int) -> list[dict[str, str]]:
    """Single lowercase words with a plain first sense of 4 to 16 words, spelled without UNK."""
    with tempfile.TemporaryDirectory() as work:
        root, _ = gcide_root(Path(work))
        found, seen = [], set()
        for headword, entry in gcide_entries(root / "usr/share/dictd"):
            word = headword.lower()
            if word in seen or not re.fullmatch(r"[A-Za-z][a-z]{2,11}", headword):
                continue
            sense = first_sense(entry, word)
            if sense is None or not 4 <= len(sense[1].split()) <= 16:
                continue
            seen.add(word)
            text = f"{word.capitalize()} ({sense[0]}): {sense[1]}"
            if tok.unk_id in tok.encode(text) or tok.unk_id in tok.encode(QUESTION.format(w=word)):
                continue
            found.append({"word": word, "part": sense[0], "gloss": sense[1], "entry": text})
    random.Random(seed).shuffle(found)
    return found[:n]


def _pretrain(corpus: np.ndarray, facts: np.ndarray | None, mix: float, seed: int) -> GPT:
    """The tier's base-model recipe (shape, steps, batch, learning rate, warm-up, cosine decay) on one
    thread, each row of a batch drawn from the facts stream with probability `mix`."""
    p = MINI
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = GPT(GPTConfig(block_size=p.block_size, vocab_size=p.vocab_size, n_layer=p.n_layer,
                          n_head=p.n_head, n_embd=p.n_embd, bias=True))
    optimizer = model.configure_optimizer(0.1, p.base_lr, (0.9, 0.95), "cpu")
    warmup, t = max(1, p.base_iters // 10), p.block_size
    for step in range(p.base_iters):
        lr = p.base_lr * (step + 1) / warmup if step < warmup else \
            p.base_lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, p.base_iters - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = []
        for _ in range(p.base_batch):
            source = facts if facts is not None and rng.random() < mix else corpus
            i = int(rng.integers(0, len(source) - t - 1))
            rows.append(source[i:i + t + 1].astype(np.int64))
        batch = torch.from_numpy(np.stack(rows))
        _, loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return model.eval()


def _facts(tok: chat_lm.ChatTokenizer, words: list[dict[str, str]], copies: int, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    stream: list[int] = []
    for _ in range(copies):
        for w in rng.sample(words, len(words)):
            stream += [*tok.encode(w["entry"]), tok.eos_id]
    return np.array(stream, dtype=np.uint16)


@torch.no_grad()
def _logprob(model: Any, tok: chat_lm.ChatTokenizer, prefix: str, text: str) -> float:
    """log P(text | prefix) under an HF model."""
    p, x = tok.encode(prefix), tok.encode(" " + text)
    ids = torch.tensor([p + x])
    logits = model(input_ids=ids).logits[0, len(p) - 1:-1]
    return float(torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(x)[:, None]).sum())


def _choices(group: list[dict[str, str]], seed: int) -> list[list[int]]:
    """For each word, its own index then three others of its group."""
    rng = random.Random(seed)
    return [[i, *rng.sample([j for j in range(len(group)) if j != i], 3)] for i in range(len(group))]


def _content(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP and len(w) > 2}


def _measure(base: Any, sft: Any, tok: chat_lm.ChatTokenizer, group: list[dict[str, str]], seed: int
             ) -> dict[str, float]:
    choices = _choices(group, seed)
    a = b = c = 0
    answers = chat_lm.generate(sft, tok, [QUESTION.format(w=w["word"]) for w in group], temperature=0,
                               max_new_tokens=MINI.max_new_tokens)
    for k, options in enumerate(choices):
        w = group[k]
        head = w["entry"].split(":")[0] + ":"
        a += int(np.argmax([_logprob(base, tok, head, group[j]["gloss"]) for j in options]) == 0)
        prompt = chat_lm.prompt_for(QUESTION.format(w=w["word"]))
        b += int(np.argmax([_logprob(sft, tok, prompt, group[j]["gloss"]) for j in options]) == 0)
        said = _content(chat_lm.clean_answer(answers[k])) - {w["word"]}
        overlaps = [len(said & _content(group[j]["gloss"])) for j in options]
        c += int(overlaps[0] > max(overlaps[1:]))
    n = len(group)
    return {"base_picks_own_gloss": a / n, "sft_picks_own_gloss": b / n, "answer_names_own_gloss": c / n,
            "answers_sample": [f"{group[k]['word']}: {chat_lm.clean_answer(answers[k])}" for k in range(3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-group", type=int, default=100, help="words in each of probe, taught, control")
    parser.add_argument("--copies", type=int, default=12, help="each repeated entry's copies in the stream")
    parser.add_argument("--mix", type=float, default=0.25, help="share of pretraining rows from the repeated "
                                                                  "entries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the tier's base model is trained
    began = time.monotonic()
    dictionary = build_corpus("dictionary", cache_dir(), progress=False)
    corpus = compact_corpus(dictionary, MINI.vocab_size, cache_dir())
    with tempfile.TemporaryDirectory() as tmp:
        tok = _tokenizer(Path(tmp) / "tokenizer", corpus.path / "vocab.json")
        words = _words(tok, 3 * args.per_group, args.seed)
        n = args.per_group
        probe, taught, control = words[:n], words[n:2 * n], words[2 * n:3 * n]
        train_tokens = np.array(corpus.tokens("train"))
        facts = _facts(tok, probe + taught, args.copies, args.seed)
        demos = [(QUESTION.format(w=w["word"]), w["gloss"]) for w in taught]
        results: dict[str, Any] = {}
        for arm, mix in (("repeated", args.mix), ("as shipped", 0.0)):
            t0 = time.monotonic()
            gpt = _pretrain(train_tokens, facts, mix, args.seed)
            base = gpt.to_hf()
            sft = gpt.to_hf()
            losses = chat_lm.finetune(sft, tok, demos, steps=MINI.sft_steps, batch_size=MINI.sft_batch,
                                      learning_rate=MINI.sft_lr, mask_prompt=True, seed=args.seed)
            results[arm] = {"mix": mix, "sft_last_loss": losses[-1],
                            "seconds": round(time.monotonic() - t0, 1),
                            **{g: _measure(base, sft, tok, words_, args.seed)
                               for g, words_ in (("probe", probe), ("control", control))}}
            print(arm, json.dumps({g: {k: v for k, v in results[arm][g].items() if k != "answers_sample"}
                                   for g in ("probe", "control")}), flush=True)
    rows = MINI.base_iters * MINI.base_batch * args.mix
    exposures = rows * MINI.block_size / max(1, len(facts) / args.copies)
    out = {"what": __doc__.split("\n\n")[0], "command": " ".join(["python", *sys.argv]),
           "settings": {**vars(args), "out": str(args.out),
                        "expected_exposures_per_entry": round(exposures, 1),
                        "repeated_stream_tokens": len(facts)},
           "chance": 0.25, "seconds": round(time.monotonic() - began, 1), "results": results}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["results"], indent=1))


if __name__ == "__main__":
    main()
