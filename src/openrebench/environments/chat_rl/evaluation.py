"""The judge: which of two answers to an instruction is better, asked of the run's `judge` model.

    prefs = await evaluate(prompts, pairs, max_workers=8)

For each instruction `prompts[i]` and answers `pairs[i] = (a, b)`: 1.0 where the judge prefers `a`,
0.0 where it prefers `b`, 0.5 for a tie, None where the judge could not be asked (after retries) or its
verdict could not be read (`unreadable=` sets what such a pair counts instead: the scorer counts it as a
loss for the submission's answer, so an answer cannot buy its way out of a comparison it would lose).
This is the agent's only way to the judge (through the model gateway: OPENAI_BASE_URL and
OPENAI_API_KEY are set in the sandbox) and the scorer asks it the same way, with its own copy of this
file. Every call spends the run's model budget.

Two methods, by the judge model (`settings.json` in the workspace names the tier's):

- `likelihood`, for a base model (the mini tier's Gemma 3 270M, which cannot follow a judging prompt):
  an answer's score is how much more probable the instruction makes it, under the judge, than it is
  anyway: log P(answer | "Question: <instruction>\\nAnswer:") - log P(answer | "Answer:"), from the
  completions API's `echo` log-probabilities, summed over the answer's new words only: a token counts
  when it is part of a word (letters or digits) not copied from the instruction (copied text is what a
  language model predicts best once it has seen it: echoing the instruction, or just its quoted word,
  beat every reference answer before this rule; now a copy scores 0). An answer that fits this
  instruction gains most. The better answer has the higher score (each answer is scored once per call,
  however many pairs it is in).
- `prompted`, for an instruction-tuned chat model (the full tier's Llama-3-8B-Instruct, as in the paper):
  the model sees the instruction and both answers and names the better one, asked twice, once in each
  order. The verdict is read constrained: the log-probabilities of the two labels as the reply's first
  token (`top_logprobs`; the reply's text only where the backend gives none), summed over both orders,
  so a bias for the first (or second) place cancels. The two labels are letters drawn at random per
  pair, so an answer cannot name the label it would need ("Answer A is better" names no label, or the
  wrong one as often as the right, and any label letter standing alone in an answer is shown in lower
  case: "Verdict: K" reads "Verdict: k"); answers are stripped of chat-template tokens (`<|eot_id|>`,
  `<start_of_turn>`, `[INST]`...) and of the prompt's own section marks (`###`) before they are shown,
  so an answer cannot end the user's turn and write the judge's reply, nor open a section of its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROLE = "judge"
MAX_ANSWER_CHARS = 400  # answers are cut to this before judging (the scorer's answers are far shorter)
RETRIES = 4
BATCH = 8  # answers per likelihood request: 16 texts, the gateway's most per request
CONDITIONED = "Question: {instruction}\nAnswer:"
UNCONDITIONED = "Answer:"
PROMPTED = (
    "You are judging two answers to the same instruction. Pick the answer that follows the instruction "
    "better: correct, relevant, clear and concise.\n\n### Instruction:\n{instruction}\n\n### Answer {x}:\n{a}"
    "\n\n### Answer {y}:\n{b}\n\nWhich answer is better? Reply with the single letter {x} or {y}."
)
LABELS = "CDEFGHJKLMNPQRSTUVWXYZ"  # drawn per pair; not A or I (words), not B (A's usual partner)
TOP_LOGPROBS = 20
# Chat-template control text of the common families (Llama 3, ChatML, GPT, Gemma, Llama 2, Mistral,
# Phi) and any <|...|> token: an answer holding one could close the user's turn and write the verdict.
_TEMPLATE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|</?(?:start_of_turn|end_of_turn|bos|eos|s|pad|unk)>|\[/?INST\]|<</?SYS>>"
    r"|\[/?(?:SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_RESULTS)\]",
    re.IGNORECASE,
)
_MARKS = re.compile(r"#{2,}")  # the prompt's section marks: an answer must not open a section
_LABEL = re.compile(rf"\b[{LABELS}]\b")  # a label written in an answer is shown in lower case


_SCORES: dict[tuple[str, str], float] = {}  # likelihood scores already asked for, in this process
_SCORES_KEPT = 200_000


def judge_method(default: str = "likelihood") -> str:
    """The tier's method, from `settings.json` beside this file (the workspace's), else `default`."""
    path = Path(__file__).with_name("settings.json")
    try:
        return str(json.loads(path.read_text())["judge_method"])
    except (OSError, ValueError, KeyError, TypeError):
        return default


def _clean(answer: object) -> str:
    return " ".join(str(answer).split())[:MAX_ANSWER_CHARS] if isinstance(answer, str) else ""


def _content_error(error: Exception) -> bool:
    """A refusal of the request itself (400, 422): what the answers in it made the backend reject, not
    the judge being unreachable."""
    import openai

    return isinstance(error, openai.BadRequestError | openai.UnprocessableEntityError)


def _retryable(error: Exception) -> bool:
    import openai

    if isinstance(error, openai.RateLimitError):
        return getattr(error, "code", None) != "budget_exceeded" and "budget" not in str(error)
    return isinstance(error, openai.APIConnectionError | openai.InternalServerError | openai.APITimeoutError)


async def _with_retries(call: Any) -> Any:
    for attempt in range(RETRIES + 1):
        try:
            return await call()
        except Exception as e:
            if attempt == RETRIES or not _retryable(e):
                raise
            await asyncio.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _copied(word: str, instruction_words: set[str]) -> bool:
    """A word of the answer taken from the instruction: one of its words, a longer form of one (of four
    letters or more: "archbutlers"), or a piece of one (of three or more: "butler")."""
    return word in instruction_words or any(
        (len(w) >= 4 and w in word) or (len(word) >= 3 and word in w) for w in instruction_words
    )


def _answer_logprob(choice: Any, text: str, prefix: str, instruction_words: set[str]) -> float:
    """The summed log-probability of the answer's new tokens (those after `prefix` in `text`): a token
    counts when it overlaps a word (letters or digits) of the answer and no word it overlaps is copied."""
    spans = [(m.start(), m.end(), _copied(m[0], instruction_words))
             for m in re.finditer(r"[a-z0-9]+", text.lower()) if m.start() >= len(prefix)]
    lp = choice.logprobs
    offsets = list(lp.text_offset)
    total = 0.0
    for k, (offset, value) in enumerate(zip(offsets, lp.token_logprobs, strict=True)):
        if offset < len(prefix) or value is None:
            continue
        end = offsets[k + 1] if k + 1 < len(offsets) else len(text)
        touched = [copied for start, stop, copied in spans if start < end and offset < stop]
        if touched and not any(touched):
            total += float(value)
    return total


async def likelihood_scores(
    client: Any, items: Sequence[tuple[str, str]], *, max_workers: int = 8, rejected: float | None = None
) -> list[float | None]:
    """The likelihood judge's score of each (instruction, answer): None where it failed, -inf for an
    empty answer (it loses to anything); `rejected` for answers whose request the backend refused as
    such (400, 422: None unless given; the scorer gives -inf)."""
    semaphore = asyncio.Semaphore(max_workers)
    scores: list[float | None] = [None] * len(items)
    todo = []
    for i, (instruction, answer) in enumerate(items):
        known = _SCORES.get((instruction, _clean(answer)))
        if not _clean(answer):
            scores[i] = -math.inf
        elif known is not None:
            scores[i] = known
        else:
            todo.append(i)

    async def batch(indices: list[int]) -> None:
        texts, prefixes, words = [], [], []
        for i in indices:
            instruction, answer = items[i]
            conditioned = CONDITIONED.format(instruction=" ".join(instruction.split()))
            for prefix in (conditioned, UNCONDITIONED):
                texts.append(f"{prefix} {_clean(answer)}")
                prefixes.append(prefix)
                words.append(set(_words(instruction)))
        async with semaphore:
            try:
                out = await _with_retries(
                    lambda: client.completions.create(
                        model=ROLE, prompt=texts, echo=True, max_tokens=0, logprobs=0
                    )
                )
            except Exception as e:
                if _content_error(e):
                    for i in indices:
                        scores[i] = rejected
                return
        choices = sorted(out.choices, key=lambda c: c.index)
        if len(choices) != len(texts):
            return
        values = [_answer_logprob(c, t, p, w)
                  for c, t, p, w in zip(choices, texts, prefixes, words, strict=True)]
        for k, i in enumerate(indices):
            scores[i] = values[2 * k] - values[2 * k + 1]
            if len(_SCORES) < _SCORES_KEPT:
                _SCORES[(items[i][0], _clean(items[i][1]))] = scores[i]

    await asyncio.gather(*(batch(todo[j : j + BATCH]) for j in range(0, len(todo), BATCH)))
    return scores


def _shown(answer: object) -> str:
    """An answer as the prompted judge sees it: chat-template tokens and section marks removed, then
    cleaned as every answer is (whitespace folded, cut to MAX_ANSWER_CHARS)."""
    if not isinstance(answer, str):
        return ""
    previous = None
    while previous != answer:  # "<|eo<|x|>t_id|>" must not become "<|eot_id|>" once the inner one goes
        previous = answer
        answer = _MARKS.sub(" ", _TEMPLATE.sub("", answer)).replace("<|", "").replace("|>", "")
    return _LABEL.sub(lambda m: m[0].lower(), _clean(answer))


def _letter(text: str, labels: tuple[str, str]) -> str | None:
    """The verdict read from the reply's text: its first standalone capital that is one of `labels`
    (case kept, so an article "a" is no verdict)."""
    found = re.search(rf"\b([{labels[0]}{labels[1]}])\b", text.strip())
    return found[1] if found else None


def _margin(choice: Any, labels: tuple[str, str]) -> float | None:
    """log P(first label) - log P(second label) as the reply's first token, from `top_logprobs` (each
    label's probability summed over its spellings: "K", " K"); a label outside the top ones counts at
    the least probability listed. Without log-probabilities, the reply's text: +1 or -1. None: no
    verdict."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if content:
        tops = getattr(content[0], "top_logprobs", None) or []
        mass = {label: 0.0 for label in labels}
        floor = min((float(t.logprob) for t in tops), default=-math.inf)
        for t in tops:
            token = str(getattr(t, "token", "")).strip()
            if token in mass:
                mass[token] += math.exp(float(t.logprob))
        if any(mass.values()):
            first, second = (math.log(mass[x]) if mass[x] else floor for x in labels)
            return first - second
    letter = _letter(getattr(choice.message, "content", None) or "", labels)
    return None if letter is None else (1.0 if letter == labels[0] else -1.0)


async def _prompted(
    client: Any,
    prompts: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    max_workers: int,
    seed: int | None,
    unreadable: float | None = None,
) -> list[float | None]:
    rng = random.Random(seed)
    labels = [tuple(rng.sample(LABELS, 2)) for _ in pairs]  # drawn per pair, from the seed
    semaphore = asyncio.Semaphore(max_workers)

    async def ask(instruction: str, a: str, b: str, x: str, y: str) -> float | Exception | None:
        """The margin for `a` (shown first, as x) over `b` (as y); an exception the backend raised."""
        text = PROMPTED.format(instruction=instruction.strip(), a=a, b=b, x=x, y=y)
        async with semaphore:
            try:
                out = await _with_retries(
                    lambda: client.chat.completions.create(
                        model=ROLE,
                        messages=[{"role": "user", "content": text}],
                        max_tokens=4,  # the verdict is the first token's; the text reads "**K**" too
                        temperature=0,
                        logprobs=True,
                        top_logprobs=TOP_LOGPROBS,
                    )
                )
            except Exception as e:
                return e
        return _margin(out.choices[0], (x, y))

    async def one(instruction: str, pair: tuple[str, str], xy: tuple[str, str]) -> float | None:
        a, b = _shown(pair[0]), _shown(pair[1])
        if not a or not b:
            return 0.5 if not a and not b else float(bool(a))
        x, y = xy
        forward, backward = await asyncio.gather(ask(instruction, a, b, x, y), ask(instruction, b, a, x, y))
        if isinstance(forward, Exception) or isinstance(backward, Exception):
            content = all(not isinstance(m, Exception) or _content_error(m) for m in (forward, backward))
            return unreadable if content else None
        if forward is None or backward is None:
            return unreadable
        return preference(forward - backward, 0.0)

    return list(
        await asyncio.gather(*(one(p, pair, xy) for p, pair, xy in zip(prompts, pairs, labels, strict=True)))
    )


def preference(a: float | None, b: float | None) -> float | None:
    """Which of two likelihood scores wins: 1.0 the first, 0.0 the second, 0.5 equal, None unknown."""
    if a is None or b is None:
        return None
    if a == b:
        return 0.5
    return 1.0 if a > b else 0.0


async def evaluate(
    prompts: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    max_workers: int = 8,
    *,
    client: Any = None,
    method: str | None = None,
    seed: int | None = None,
    unreadable: float | None = None,
) -> list[float | None]:
    """The judge's preference for the first answer of each pair (see the module's docstring).

    `client`: an `openai.AsyncOpenAI` (default: one from OPENAI_BASE_URL and OPENAI_API_KEY);
    `method`: `likelihood` or `prompted` (default: the tier's, from settings.json); `seed`: the prompted
    judge's labels, drawn per pair; `unreadable`: what a pair counts whose verdict could not be
    read or whose request the backend refused (None: left out)."""
    if len(prompts) != len(pairs):
        raise ValueError(f"{len(prompts)} prompts but {len(pairs)} pairs")
    if client is None:
        import openai

        client = openai.AsyncOpenAI(max_retries=0, timeout=600)
    method = method or judge_method()
    if method == "prompted":
        return await _prompted(client, prompts, pairs, max_workers, seed, unreadable)
    if method != "likelihood":
        raise ValueError(f"unknown judge method {method!r} (likelihood, prompted)")
    unique: dict[tuple[str, str], int] = {}
    for instruction, (a, b) in zip(prompts, pairs, strict=True):
        for answer in (a, b):
            unique.setdefault((instruction, _clean(answer)), len(unique))
    scores = await likelihood_scores(client, list(unique), max_workers=max_workers)
    return [
        preference(scores[unique[(p, _clean(a))]], scores[unique[(p, _clean(b))]])
        for p, (a, b) in zip(prompts, pairs, strict=True)
    ]


def evaluate_sync(
    prompts: Sequence[str], pairs: Sequence[tuple[str, str]], max_workers: int = 8, **kwargs: Any
) -> list[float | None]:
    """`evaluate` for code without an event loop."""
    return asyncio.run(evaluate(prompts, pairs, max_workers, **kwargs))
