"""What chat_rl's tests share: a tiny version of the mini tier's settings (a one-layer model, eight
held-out instructions, pipelines of a few prompts), and an OpenAI-compatible fake judge served over
HTTP (the echo log-probabilities of `test_chat_rl_judge.EchoJudge`'s rule), for code in child
processes: the asset builder's pipelines reach it through a ScoringAccess."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from openrebench.environments.chat_rl import evaluation
from openrebench.environments.chat_rl.env import MINI
from openrebench.environments.chat_rl.params import Pipeline
from openrebench.runs import ScoringAccess

TINY = MINI.model_copy(update={
    "vocab_size": 2048, "n_layer": 1, "n_head": 2, "n_embd": 32, "base_iters": 6, "base_batch": 4,
    "n_train_prompts": 40, "n_sft": 40, "n_heldout": 8, "sft_steps": 3, "sft_batch": 4, "max_new_tokens": 8,
    "start": Pipeline(prompts=8, samples=2, steps=2, learning_rate=3e-4, mask_prompt=False),
    "reference": Pipeline(prompts=8, samples=4, rounds=1, steps=2, learning_rate=5e-4, mask_prompt=True)})
"""The mini tier's code at a size that builds in seconds (tests use it as the `mini` tier's params)."""


ASSOCIATED = {"lantern": {"light", "lamp"}, "river": {"stream", "water"}, "tide": {"sea", "moon"},
              "moon": {"night"}, "hill": {"slope"}, "dale": {"valley"}, "vale": {"valley"}, "*": {"aptly"}}
"""What the fake judge knows: after a question naming a key, these words are likely ("*": any question)."""


def echo_logprobs(text: str) -> dict[str, Any]:
    """The fake judge's echo of one text: each word after the last 'Answer:' costs -3 nats; -1 after a
    question where the word is associated with one of the question's words (ASSOCIATED), or is one of
    them (copied: the judge's client leaves copied words out of an answer's score, as a copy is what a
    real model predicts best). So an answer scores 2 per associated word."""
    head, _, answer = text.rpartition("Answer:")
    question = set(re.findall(r"[a-z]+", head.lower()))
    associated = set().union(*(ASSOCIATED.get(w, set()) for w in question | {"*"}))
    likely = (question | associated) if head else set()
    offsets, values, tokens = [0], [None], [text[:1]]
    start = len(head) + len("Answer:")
    for word in answer.split():
        at = text.index(word, start)
        offsets.append(at)
        values.append(-1.0 if word.lower().strip('.,"') in likely else -3.0)
        tokens.append(word)
        start = at + len(word)
    return {"tokens": tokens, "token_logprobs": values, "text_offset": offsets, "top_logprobs": None}


@contextlib.contextmanager
def completions_server(handler: Any) -> Iterator[str]:
    """An OpenAI-compatible server on 127.0.0.1 whose `/v1/completions` is `handler`, in a thread of its
    own; yields its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        app = web.Application(client_max_size=1 << 24)
        app.router.add_post("/v1/completions", handler)
        # a handler still waiting when the server stops (a judge that hangs) is cancelled, not awaited
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        box["port"] = runner.addresses[0][1]
        box["stop"] = asyncio.Event()
        ready.set()
        await box["stop"].wait()
        await runner.cleanup()
        hung = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}/v1"
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)


async def _echo_completions(request: web.Request) -> web.Response:
    body = await request.json()
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    choices = [{"index": i, "text": p, "logprobs": echo_logprobs(p), "finish_reason": "length"}
               for i, p in enumerate(prompts)]
    tokens = sum(len(c["logprobs"]["tokens"]) for c in choices)
    usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
    return web.json_response({"id": "cmpl-fake", "object": "text_completion", "created": 0,
                              "model": "fake", "choices": choices, "usage": usage})


@contextlib.contextmanager
def echo_judge_server() -> Iterator[str]:
    """An OpenAI-compatible judge on 127.0.0.1 answering echo completions; yields its base URL."""
    with completions_server(_echo_completions) as url:
        yield url


def judge_access(url: str, judge: str = "fake-echo") -> Any:
    """A ScoringAccessFn giving the scorer, and an asset build, the fake judge at `url`."""
    access = ScoringAccess(env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "test"}, models={"judge": judge})

    @contextlib.contextmanager
    def give(run: Any, sandboxed: bool, /, *, build: bool = False) -> Iterator[ScoringAccess]:
        yield access

    return give


# A prompted (chat) judge for the full tier's method, and reading its prompt back.

def labels_of(prompt: str) -> tuple[str, str]:
    found = re.search(r"Reply with the single letter ([A-Z]) or ([A-Z])\.$", prompt)
    assert found, prompt
    return found[1], found[2]


def shown_answers(prompt: str) -> tuple[str, str]:
    x, y = labels_of(prompt)
    first = prompt.split(f"### Answer {x}:\n")[1].split(f"\n\n### Answer {y}:")[0]
    second = prompt.split(f"### Answer {y}:\n")[1].split("\n\nWhich answer")[0]
    return first, second


def first_token_logprobs(*pairs: tuple[str, float]) -> Any:
    """A chat choice's `logprobs` with the first token's top log-probabilities."""
    tops = [SimpleNamespace(token=t, logprob=lp) for t, lp in pairs]
    first = SimpleNamespace(token=pairs[0][0], logprob=pairs[0][1], top_logprobs=tops)
    return SimpleNamespace(content=[first])


class ChatJudge:
    """A prompted judge: `verdict(prompt)` gives its reply's text, `margins(prompt)` (optional) the top
    log-probabilities of its first token."""

    def __init__(self, verdict: Any = None, margins: Any = None, reply: str | None = None) -> None:
        self.seen: list[str] = []
        self.verdict = verdict or (lambda prompt: reply if reply is not None else labels_of(prompt)[0])
        self.margins = margins
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, *, model: str, messages: list[dict[str, str]], max_tokens: int,
                     temperature: float, logprobs: bool, top_logprobs: int) -> Any:
        assert model == "judge" and max_tokens == 4 and logprobs and top_logprobs == evaluation.TOP_LOGPROBS
        prompt = messages[0]["content"]
        self.seen.append(prompt)
        lp = self.margins(prompt) if self.margins else None
        return SimpleNamespace(choices=[SimpleNamespace(
            message=SimpleNamespace(content=self.verdict(prompt)), logprobs=lp)])
