"""The reference scaffold: sample several programs per call, keep those that pass the public tests
(judged with the scorer's own utilities), sample again while none does, and let the survivors vote.

Two prompt styles, chosen once by what the task model serves: a base model (the completions
endpoint) continues a file of worked examples ending in the problem's statement and the first lines of
a Rust program that reads all of standard input; a chat model is asked for one fenced Rust program.
A small base model mostly adapts the last worked example it read, so after the examples (always in
the same order: a prefix every prompt shares, which the model server keeps and does not read again) the
one whose statement shares the most words with the problem's comes again, last; a second round puts the
next closest there instead.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import rust_codecontests_utils as rcu
from openai import AsyncOpenAI

MODEL = "task_model"
SAMPLES = 4           # programs per call
# Sampling rounds at most per problem. A chat model also stops once 45 s have gone (a batch has 60 s in
# the paper); a base model's rounds are counted, not timed, so that what the scaffold draws does not
# depend on how fast the machine serves the model.
ROUNDS = {"chat": 3, "completion": 2}
CHAT_TIME_BUDGET_S = 45.0
MAX_TOKENS = 150

HEAD = """use std::io::{self, Read};

fn main() {
    let mut input = String::new();
    io::stdin().read_to_string(&mut input).unwrap();
    let mut it = input.split_whitespace();
"""

# Worked examples for the base model, in the shape of a problem statement: generic ways of reading
# input and printing one answer, none of them a problem of the validation or the held-out families.
EXAMPLES = [
    ("You are given two integers a and b. Print a - b.", "One line with two integers a and b.",
     "7 3", "4", """\
    let a: i64 = it.next().unwrap().parse().unwrap();
    let b: i64 = it.next().unwrap().parse().unwrap();
    println!("{}", a - b);
}"""),
    ("You are given n integers. Count how many of them are positive.",
     "The first line contains n. The second line contains n integers.", "3\n1 -2 5", "2", """\
    let n: usize = it.next().unwrap().parse().unwrap();
    let mut count = 0;
    for _ in 0..n {
        let x: i64 = it.next().unwrap().parse().unwrap();
        if x > 0 {
            count += 1;
        }
    }
    println!("{}", count);
}"""),
    ("You are given a word. Print its length.", "One line with a word of lowercase letters.", "hello", "5",
     """\
    let s = it.next().unwrap().to_string();
    println!("{}", s.len());
}"""),
    ("You are given an integer x. Print BIG if x is at least 100, otherwise print SMALL.",
     "One line with an integer x.", "42", "SMALL", """\
    let x: i64 = it.next().unwrap().parse().unwrap();
    if x >= 100 {
        println!("BIG");
    } else {
        println!("SMALL");
    }
}"""),
    ("You are given n integers. Print each of them multiplied by 3, separated by spaces.",
     "The first line contains n. The second line contains n integers.", "3\n1 -2 5", "3 -6 15", """\
    let n: usize = it.next().unwrap().parse().unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let x: i64 = it.next().unwrap().parse().unwrap();
        out.push((x * 3).to_string());
    }
    println!("{}", out.join(" "));
}"""),
    ("You are given an integer n. Print the sum of the squares 1*1 + 2*2 + ... + n*n.",
     "One line with an integer n.", "3", "14", """\
    let n: i64 = it.next().unwrap().parse().unwrap();
    let mut total: i64 = 0;
    for i in 1..=n {
        total += i * i;
    }
    println!("{}", total);
}"""),
]

_chat_only = False


def _comment(text: str) -> str:
    return "\n".join(f"// {line}" for line in text.strip().splitlines())


def _statement(description: str, input_format: str, example_in: str, example_out: str) -> str:
    return _comment(f"{description}\n\nInput\n{input_format}\n\nExample\nInput\n{example_in}\nOutput\n"
                    f"{example_out}") + "\n"


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def closest_last(problem: dict[str, Any], round_: int = 0) -> list[tuple[str, ...]]:
    """The worked examples, those whose statements share the most words with the problem's last (Jaccard
    similarity; ties keep their order); from the second round on, the next closest last instead."""
    words = _words(problem["description"])

    def similarity(example: tuple[str, ...]) -> float:
        theirs = _words(example[0] + " " + example[1])
        return len(words & theirs) / max(1, len(words | theirs))

    ordered = sorted(EXAMPLES, key=similarity)
    if round_ % 2 == 1:
        ordered[-1], ordered[-2] = ordered[-2], ordered[-1]
    return ordered


def _shot(example: tuple[str, ...]) -> str:
    return _statement(*example[:4]) + HEAD + example[4] + "\n"


PREFIX = "\n".join(_shot(example) for example in EXAMPLES) + "\n"


def completion_prompt(problem: dict[str, Any], round_: int = 0) -> str:
    """The worked examples, the closest of them again, then the problem's statement (which quotes its
    example) and the program's head."""
    closest = _shot(closest_last(problem, round_)[-1])
    return PREFIX + closest + "\n" + _comment(problem["description"]) + "\n" + HEAD


FORMAT = re.compile(r'(print(?:ln)?!\()"([^"\\]*)"((?:\s*,[^;]*)?)\);')


def repair(source: str) -> str:
    """Mend the base model's commonest slip, a format string whose `{}` do not match its arguments, by
    keeping as many `{}` as there are arguments (a program that then compiles may still be wrong)."""
    def fix(m: re.Match[str]) -> str:
        text, args = m.group(2), m.group(3)
        n_args = len([a for a in args.split(",") if a.strip()]) if args.strip() else 0
        holes = text.count("{}")
        if holes == n_args or "{" in text.replace("{}", ""):
            return m.group(0)
        if holes > n_args:
            parts = text.split("{}")
            text = "{}".join(parts[:n_args + 1]) + "".join(parts[n_args + 1:])
        else:
            text = text + " {}" * (n_args - holes)
        return f'{m.group(1)}"{text}"{args});'
    return FORMAT.sub(fix, source)


def chat_prompt(problem: dict[str, Any]) -> str:
    return ("Solve this competitive programming problem in Rust (edition 2018, standard library only). Read "
            "standard input, write standard output. Answer with one complete program in a ```rust block.\n\n"
            + problem["description"])


async def sample(client: AsyncOpenAI, semaphore: asyncio.Semaphore, problem: dict[str, Any],
                 temperature: float, round_: int) -> list[str]:
    """Candidate programs from one call."""
    global _chat_only
    if not _chat_only:
        try:
            async with semaphore:
                out = await client.completions.create(
                    model=MODEL, prompt=completion_prompt(problem, round_), n=SAMPLES,
                    temperature=temperature, max_tokens=MAX_TOKENS, stop=["\n}\n"], seed=round_)
            return [repair(HEAD + c.text.rstrip() + "\n}\n") for c in out.choices]
        except (openai.NotFoundError, openai.BadRequestError, openai.UnprocessableEntityError) as e:
            if "complet" not in str(e).lower() and "chat" not in str(e).lower():
                raise
            _chat_only = True  # a chat model: its endpoint alone from now on
    async with semaphore:
        out = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": chat_prompt(problem)}], n=SAMPLES,
            temperature=temperature, max_tokens=1024, seed=round_)
    found = (rcu.extract_rust(c.message.content or "") for c in out.choices)
    return [f for f in found if f]


def _normal(source: str) -> str:
    return re.sub(r"\s+", " ", source).strip()


async def passes_public(source: str, problem: dict[str, Any]) -> bool:
    with tempfile.TemporaryDirectory() as workdir:
        result = await rcu.evaluate_problem(source, problem, workdir=Path(workdir), include_hidden=False)
    return result.solved


async def generate_solution(client: AsyncOpenAI, semaphore: asyncio.Semaphore,
                            problem: dict[str, Any]) -> str:
    start = time.monotonic()
    survivors: list[str] = []
    first = ""
    round_ = 0
    while not survivors and round_ < ROUNDS["chat" if _chat_only else "completion"]:
        if _chat_only and time.monotonic() - start > CHAT_TIME_BUDGET_S:
            break
        round_ += 1
        try:
            candidates = await sample(client, semaphore, problem, temperature=0.3 * round_, round_=round_ - 1)
        except openai.APIError:
            continue
        first = first or (candidates[0] if candidates else "")
        # Each distinct program checked once: a call's samples often repeat one another (about half of
        # them on the mini tier), and rustc takes the cores the model server decodes on.
        distinct = list(dict.fromkeys(candidates))
        checks = await asyncio.gather(*(passes_public(c, problem) for c in distinct))
        passed = {c for c, ok in zip(distinct, checks, strict=True) if ok}
        survivors += [c for c in candidates if c in passed]
    if not survivors:
        return first
    votes = Counter(_normal(s) for s in survivors)
    best = votes.most_common(1)[0][0]
    return next(s for s in survivors if _normal(s) == best)
