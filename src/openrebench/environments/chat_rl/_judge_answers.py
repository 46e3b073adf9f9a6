"""The likelihood judge's scores of both reference models' held-out answers, written as JSON: run by the
asset builder as a child process started through the run's model access (the judge is reached from
there, with OPENAI_BASE_URL and OPENAI_API_KEY).

    python -m openrebench.environments.chat_rl._judge_answers HELDOUT.jsonl OUT.json WORKERS
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from . import chat_lm, evaluation


async def _scores(rows: list[dict[str, str]], workers: int) -> dict[str, list[float | None]]:
    import openai

    client = openai.AsyncOpenAI(max_retries=0, timeout=600)  # one client in one event loop
    return {name: await evaluation.likelihood_scores(
        client, [(r["instruction"], r[f"{name}_answer"]) for r in rows], max_workers=workers)
        for name in ("base", "sft")}


def main(argv: list[str]) -> None:
    heldout, out, workers = Path(argv[0]), Path(argv[1]), int(argv[2])
    out.write_text(json.dumps(asyncio.run(_scores(chat_lm.read_jsonl(heldout), workers))) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
