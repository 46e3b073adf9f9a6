"""rust_codecontests' reference scaffold, its sampling policy without a model: the worked example closest to
the problem comes last (the small base model adapts the last one it read), and on a base model it draws a
fixed number of rounds however slowly the model answers, so that what it draws, and so its score, does not
follow the machine's speed. And the mini tier's limits: its scoring timeout holds what its batches and its
judging may take."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from openrebench.environments.rust_codecontests import rust_utils

HERE = Path(__file__).parents[2] / "src" / "openrebench" / "environments" / "rust_codecontests"


@pytest.fixture
def ref(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The reference module as the scoring host loads it: its utilities under the name the workspace has."""
    monkeypatch.setitem(sys.modules, "rust_codecontests_utils", rust_utils)
    spec = importlib.util.spec_from_file_location("reference_scaffold",
                                                  HERE / "reference" / "solve_code_contests_rust.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _problem(description: str) -> dict[str, Any]:
    return {"name": "p", "description": description, "public_tests": {"input": ["1\n"], "output": ["1\n"]}}


def test_the_closest_worked_example_comes_last_and_the_next_closest_in_the_second_round(
        ref: ModuleType) -> None:
    problem = _problem("You are given a word of lowercase letters. Print its length times two.")
    first, second = ref.closest_last(problem, 0), ref.closest_last(problem, 1)
    assert sorted(first) == sorted(ref.EXAMPLES) == sorted(second)  # every example, once
    assert first[-1][0] == "You are given a word. Print its length."
    assert second[-1] == first[-2] and second[-2] == first[-1] and second[:-2] == first[:-2]
    prompt = ref.completion_prompt(problem, 0)
    assert prompt.endswith(ref.HEAD) and "// You are given a word of lowercase letters." in prompt
    assert prompt.rindex("Print its length.") > max(prompt.rindex(e[0]) for e in first[:-1])
    other = _problem("You are given n integers. Count how many of them are positive, then print it.")
    assert ref.closest_last(other, 0)[-1][0] == "You are given n integers. Count how many of them are " \
                                                "positive."
    # Every worked example lies in a prefix the prompts of all problems and rounds share (the model server
    # keeps it: only the closest example, again, and the statement are read per prompt).
    later = ref.completion_prompt(other, 1)
    shared = prompt[:next((i for i, (a, b) in enumerate(zip(prompt, later, strict=False)) if a != b), 0)]
    assert all(e[0] in shared for e in ref.EXAMPLES) and len(prompt) - len(shared) < len(shared) / 3


class _Completions:
    """A base model that answers slowly (each call moves the scaffold's clock 500 s) with programs that
    never pass, recording what it was asked."""

    def __init__(self, clock: itertools.count) -> None:
        self.calls: list[dict[str, Any]] = []
        self.clock = clock

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        for _ in range(500):
            next(self.clock)
        programs = [f'    println!("{i}");' for i in range(kwargs["n"])]
        return SimpleNamespace(choices=[SimpleNamespace(text=text) for text in programs])


def _run(ref: ModuleType, monkeypatch: pytest.MonkeyPatch, passing: set[int]) -> tuple[str, list[dict]]:
    clock = itertools.count()
    monkeypatch.setattr(ref.time, "monotonic", lambda: float(next(clock)))
    completions = _Completions(clock)

    async def passes_public(source: str, problem: dict[str, Any]) -> bool:
        return len(completions.calls) in passing  # the round's programs pass when its number is listed

    monkeypatch.setattr(ref, "passes_public", passes_public)
    client = SimpleNamespace(completions=completions)
    answer = asyncio.run(ref.generate_solution(client, asyncio.Semaphore(1), _problem("Print a + b.")))
    return answer, completions.calls


def test_a_base_model_gets_every_round_however_slowly_it_answers(ref: ModuleType,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    answer, calls = _run(ref, monkeypatch, passing=set())
    assert len(calls) == ref.ROUNDS["completion"] == 2  # 1,000 s of model time, and still both rounds
    assert [c["seed"] for c in calls] == [0, 1] and [c["n"] for c in calls] == [ref.SAMPLES] * 2
    assert calls[0]["temperature"] < calls[1]["temperature"]
    assert calls[0]["prompt"] != calls[1]["prompt"]  # the second round ends in another example
    assert answer.startswith(ref.HEAD) and 'println!("0");' in answer  # no survivor: the first program


def test_sampling_stops_at_the_first_round_with_a_program_that_passes(
        ref: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    answer, calls = _run(ref, monkeypatch, passing={1})
    assert len(calls) == 1 and answer.startswith(ref.HEAD)


def test_repeated_samples_are_checked_once_and_still_vote(ref: ModuleType,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A call's samples often repeat one another: each distinct program is compiled and tested once, and
    the repeats still count as votes."""
    checked: list[str] = []

    async def passes_public(source: str, problem: dict[str, Any]) -> bool:
        checked.append(source)
        return "print" in source

    programs = ['    println!("1");', '    println!("2");', '    println!("2");', "    let x = 1;"]

    class Completions:
        async def create(self, **kwargs: Any) -> Any:
            return SimpleNamespace(choices=[SimpleNamespace(text=text) for text in programs])

    monkeypatch.setattr(ref, "passes_public", passes_public)
    client = SimpleNamespace(completions=Completions())
    answer = asyncio.run(ref.generate_solution(client, asyncio.Semaphore(1), _problem("Print 2.")))
    assert len(checked) == len(set(checked)) == 3
    assert 'println!("2");' in answer  # two votes against one


def test_the_mini_scoring_timeout_holds_both_batches_and_the_slowest_judging() -> None:
    """A scaffold may use each batch's whole time and return programs that each take their compile timeout
    or run every test near its limit: the scoring still ends inside the tier's limit, with a row."""
    import math

    from openrebench.environments.rust_codecontests import problems, scorer
    from openrebench.environments.rust_codecontests.env import RustCodecontests

    spec = RustCodecontests.tiers["mini"]
    params = spec.params
    _, test = problems.mini_problems()
    generating = math.ceil(len(test) / params.batch_size) * (params.batch_timeout_s
                                                             + scorer.grace_s(params.batch_timeout_s))
    per_program = [params.compile_timeout_s + p["time_limit_s"] * len(rust_utils.problem_tests(p))
                   for p in test]
    judging = math.ceil(len(test) / params.test_workers) * max(per_program)
    assert generating + judging <= spec.score_timeout_s, (generating, judging)
