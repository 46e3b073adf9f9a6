"""The offline model's generation on this machine (llama.cpp through xllamacpp): what a token costs.

rust_codecontests' mini scorings and the react demo spend their time here, so this measures the floor a
scoring of the tier stands on: milliseconds per decoding step for one request of `n` choices, on a
server of 4 slots (the tier's) or more, with 2 threads or 1; and whether a choice's numbers depend on
what else the server decodes in the same step (one greedy request alone, again alone, then beside a
request of 3 choices: the same text and log-probabilities only if they do not). Prints a table and
writes JSON.

    .venv/bin/python benchmarks/offline_decode.py \\
        --out benchmarks/results/offline_decode/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from openrebench.gateway._local import MODEL_NAME, LocalModelServer
from openrebench.runs import detect_hardware

PROMPT = "// You are given two integers a and b. Print their sum.\nuse std::io;\nfn main() {\n" * 20
TOKENS = 100
# (slots, threads, choices): the tier's server (4 slots, 2 threads) at 1 and 4 choices, one thread
# instead of two, and more slots filled by more choices.
SHAPES = [(4, 2, 1), (4, 2, 4), (4, 1, 4), (8, 2, 8), (16, 2, 16)]


def _post(server: LocalModelServer, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{server.base_url}/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json",
                                      "Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def step_ms(slots: int, threads: int, choices: int, repeats: int) -> dict[str, Any]:
    """Milliseconds per decoding step (the server's own timing of one choice), `TOKENS` steps a request."""
    with LocalModelServer(parallel=slots, threads=threads) as server:
        server.start()
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": TOKENS, "n": choices, "seed": 1,
                "ignore_eos": True, "temperature": 1.0}
        _post(server, body)  # the prompt read once: later requests find it in the slots' cache
        times = [float(_post(server, body)["timings"]["predicted_per_token_ms"]) for _ in range(repeats)]
    median = statistics.median(times)
    return {"slots": slots, "threads": threads, "choices": choices, "step_ms": times,
            "median_step_ms": median, "tokens_per_s": choices * 1000 / median}


def batch_dependence() -> dict[str, Any]:
    """One greedy request alone, again alone, and beside another request of 3 choices."""
    def logprobs(out: dict[str, Any]) -> list[float]:
        return [t["logprob"] for t in out["choices"][0]["logprobs"]["content"]]

    mine = {"model": MODEL_NAME, "prompt": "// Read two integers and print their product.\nuse std::io;\n"
            "fn main() {\n", "max_tokens": 60, "temperature": 0, "logprobs": 1, "cache_prompt": False}
    other = {"model": MODEL_NAME, "prompt": "The history of the Roman empire began", "max_tokens": 80,
             "temperature": 0, "n": 3, "cache_prompt": False}
    with LocalModelServer(parallel=4) as server:
        server.start()
        first, again = _post(server, mine), _post(server, mine)
        beside = threading.Thread(target=_post, args=(server, other))
        beside.start()
        time.sleep(0.3)  # the other request decoding when ours starts
        together = _post(server, mine)
        beside.join()
    out = {}
    for name, run in (("alone_again", again), ("beside_3_choices", together)):
        out[name] = {"same_text": run["choices"][0]["text"] == first["choices"][0]["text"],
                     "max_logprob_difference": max(abs(a - b) for a, b in
                                                   zip(logprobs(first), logprobs(run), strict=False))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="requests per shape (after one to warm up)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    began = time.monotonic()
    shapes = [step_ms(slots, threads, choices, args.repeats) for slots, threads, choices in SHAPES]
    dependence = batch_dependence()
    table = Table(title=f"The offline model's decoding ({TOKENS} tokens a choice, medians of {args.repeats})")
    for column in ("slots", "threads", "choices", "ms a step", "ms a token", "tokens/s"):
        table.add_column(column, justify="right")
    for s in shapes:
        table.add_row(str(s["slots"]), str(s["threads"]), str(s["choices"]), f"{s['median_step_ms']:.1f}",
                      f"{s['median_step_ms'] / s['choices']:.1f}", f"{s['tokens_per_s']:.0f}")
    console = Console()
    console.print(table)
    for name, d in dependence.items():
        console.print(f"greedy request {name.replace('_', ' ')}: "
                      f"{'same text' if d['same_text'] else 'different text'}, "
                      f"largest log-probability difference {d['max_logprob_difference']:.3g}")
    record = {"command": f"python benchmarks/offline_decode.py --repeats {args.repeats} --out {args.out}",
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "hardware": detect_hardware().model_dump(), "tokens_a_choice": TOKENS, "shapes": shapes,
              "batch_dependence": dependence, "seconds": round(time.monotonic() - began, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    console.print(f"written to {args.out}")


if __name__ == "__main__":
    main()
