"""The solution host: the only process that runs the agent's scaffold.

It imports `solve_code_contests_rust.py` from the solution snapshot, makes the `openai.AsyncOpenAI`
client (pointed at the gateway by OPENAI_BASE_URL and the scoring's token in OPENAI_API_KEY) and, for
each batch the scorer sends, calls `generate_solution(client, semaphore, problem)` on every problem
at once within the batch's time, answering with what each call returned. It is given only what a
scaffold may see of a problem (description, public tests, limits): the hidden tests never leave the
scorer. Nothing it says is trusted; its answers are Rust sources the scorer compiles and tests itself.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from openrebench.api import HostChannel, import_solution

MODULE = "solve_code_contests_rust"
MAX_ANSWER = 200_000  # characters of one answer kept: a program longer than this fails to compile anyway


def load(solution_dir: Path) -> Any:
    """The agent's module and its generate_solution, or a one-line reason it cannot be used."""
    module = import_solution(solution_dir, f"{MODULE}.py")
    if isinstance(module, str):
        return module
    generate = getattr(module, "generate_solution", None)
    if not callable(generate) or not asyncio.iscoroutinefunction(generate):
        return f"{MODULE}.py must define `async def generate_solution(client, semaphore, problem) -> str`"
    return generate


async def _one(generate: Any, client: Any, semaphore: asyncio.Semaphore, problem: dict[str, Any]
               ) -> dict[str, Any]:
    try:
        answer = await generate(client, semaphore, problem)
    except asyncio.CancelledError:
        return {"status": "timeout"}
    except BaseException as e:
        return {"status": "raised", "error": type(e).__name__}
    if not isinstance(answer, str):
        return {"status": "not_a_string", "error": type(answer).__name__}
    return {"status": "answered", "source": answer[:MAX_ANSWER]}


async def run_batch(generate: Any, client: Any, problems: list[dict[str, Any]], timeout_s: float,
                    concurrency: int) -> list[dict[str, Any]]:
    """Every problem of the batch at once (the semaphore is the scaffold's to respect), cut off at the
    batch's time: what is unfinished then is a timeout."""
    semaphore = asyncio.Semaphore(concurrency)
    tasks = [asyncio.ensure_future(_one(generate, client, semaphore, p)) for p in problems]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    return [t.result() if t in done and not t.cancelled() else {"status": "timeout"} for t in tasks]


def main() -> None:
    solution_dir, channel = HostChannel.from_argv()
    generate = load(solution_dir)
    if isinstance(generate, str):
        channel.send({"error": generate})
        return
    import openai

    loop = asyncio.new_event_loop()
    client = openai.AsyncOpenAI(max_retries=2, timeout=120)
    channel.send({"ready": True})
    while True:
        request = channel.receive()
        if request.get("stop"):
            break
        t0 = time.monotonic()
        results = loop.run_until_complete(run_batch(generate, client, request["problems"],
                                                    float(request["timeout_s"]), int(request["concurrency"])))
        channel.send({"results": results, "seconds": time.monotonic() - t0})


if __name__ == "__main__":
    main()
