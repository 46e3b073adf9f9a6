"""The offline model's echo (what the mini tier's likelihood judge asks for): time per judge request.

A judge request holds 8 answers, each twice (after its question, and after "Answer:" alone): 16 texts.
Two shapes: one question's 8 candidates (the reference pipeline's tournament) and 8 questions' answers
(a scoring). Each is scored, interleaved, by the plain way (one forward pass over the 16 texts padded to
the longest, the vocabulary's product on every row) and by `Likelihood.echo` (batches by length, rows
that texts share scored once). Prints medians, their ratio and the largest difference of a token's
log-probability between the two, and writes them as JSON.

    .venv/bin/python benchmarks/offline_echo.py \\
        --out benchmarks/results/gateway/$(date +%F)_offline_echo_xeon.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from openrebench.gateway._likelihood import Likelihood
from openrebench.runs import detect_hardware

ANSWERS = ["Of or pertaining to a lantern; a case that holds a light.", "It is a noun.",
           "Yes, I think so too, and the rest of it is here.", "A large natural stream of water.",
           "The coldest season of the year, when snow falls.", "I do not know what that is.",
           "A thing or a kind of thing, used or found by people.", "Food made of flour and water, baked."]
WORDS = ["lantern", "river", "bread", "winter", "hammer", "kettle", "meadow", "candle"]


def request(same_question: bool) -> list[str]:
    texts = []
    for word, answer in zip(WORDS, ANSWERS, strict=True):
        question = f'What does the word "{WORDS[0] if same_question else word}" mean?'
        texts += [f"Question: {question}\nAnswer: {answer}", f"Answer: {answer}"]
    return texts


def plain(likelihood: Likelihood, texts: list[str]) -> list[list[float]]:
    """Every row of one padded batch through the vocabulary's product (the echo before batching by
    length and sharing rows)."""
    import torch

    tok, model = likelihood._tokenizer, likelihood._model
    encoded = [tok(t, add_special_tokens=False).input_ids for t in texts]
    rows = [[tok.bos_token_id, *e] for e in encoded]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.inference_mode():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        chosen = torch.cat([hidden[i, :len(e)] for i, e in enumerate(encoded)])
        targets = torch.tensor([t for e in encoded for t in e])
        logits = model.lm_head(chosen)
        values = (-torch.nn.functional.cross_entropy(logits, targets, reduction="none")).tolist()
    out, start = [], 0
    for e in encoded:
        out.append(values[start:start + len(e)])
        start += len(e)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    likelihood = Likelihood()
    likelihood.echo(["warm up"])
    results: dict[str, Any] = {}
    for shape, same in (("one question's 8 candidates", True), ("8 questions' answers", False)):
        texts = request(same)
        times: dict[str, list[float]] = {"plain": [], "echo": []}
        for _ in range(args.repeats):
            for name in times:
                started = time.perf_counter()
                out = plain(likelihood, texts) if name == "plain" else [
                    x["token_logprobs"] for x in likelihood.echo(texts)]
                times[name].append(time.perf_counter() - started)
                if name == "plain":
                    before = out
                else:
                    after = out
        diff = max(abs(a - b) for x, y in zip(before, after, strict=True) for a, b in zip(x, y, strict=True))
        medians = {k: statistics.median(v) for k, v in times.items()}
        results[shape] = {"seconds": times, "median_s": medians, "ratio": medians["echo"] / medians["plain"],
                          "max_abs_logprob_difference": diff}
    table = Table(title="offline model's echo: one judge request (16 texts)")
    for column in ("request", "plain (s)", "echo (s)", "echo / plain", "largest difference"):
        table.add_column(column)
    for shape, r in results.items():
        table.add_row(shape, f"{r['median_s']['plain']:.3f}", f"{r['median_s']['echo']:.3f}",
                      f"{r['ratio']:.2f}", f"{r['max_abs_logprob_difference']:.1e}")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/offline_echo.py", "repeats": args.repeats,
                                    "hardware": detect_hardware().model_dump(), "results": results},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
