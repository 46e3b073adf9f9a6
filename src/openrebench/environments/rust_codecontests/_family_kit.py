"""How a mini problem family is declared, and the helpers its generator draws tests with: kept apart from
the families themselves so that the validation families (`_valid_families.py`) and the held-out ones
(`heldout/families.py`) share one registry and one set of helpers. The order in which families register
fixes the shipped problem set."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

BIG = 10**9  # scalar bounds: a sum or product of two of them needs i64, as in a real contest
LIST_MAX = 20
LIST_BOUND = 10**9
LETTERS = "abcdefghijklmnopqrstuvwxyz"

Generator = Callable[[random.Random, int], tuple[str, str]]


@dataclass(frozen=True)
class Family:
    """A kind of mini problem: `generate(rng, case)` gives one test's stdin (ending in a newline) and its
    expected stdout; `statement` is the problem text without its example (make_instance appends it)."""

    name: str
    split: str  # "valid" (the agent's) or "test" (held out)
    statement: str
    generate: Generator


FAMILIES: list[Family] = []


def _family(name: str, split: str, statement: str) -> Callable[[Generator], Generator]:
    def register(generate: Generator) -> Generator:
        FAMILIES.append(Family(name, split, statement.strip(), generate))
        return generate
    return register


def _edge(case: int, edges: list[Any]) -> Any:
    """The family's edge case for test `case` (1-based), or None where the case is a random one."""
    return edges[case - 1] if 1 <= case <= len(edges) else None


def _num(rng: random.Random, lo: int, hi: int, case: int = 5) -> int:
    """An integer in [lo, hi]: small in the example (readable), else of a random magnitude (most of a
    uniform draw over [-1e9, 1e9] would have nine digits, and small values catch other bugs)."""
    span = 20 if case == 0 else rng.choice((9, 99, 9999, hi - lo))
    centre = min(max(0, lo), hi)
    return rng.randint(max(lo, centre - span), min(hi, centre + span))


def _list(rng: random.Random, case: int, lo: int = -LIST_BOUND, hi: int = LIST_BOUND,
          min_n: int = 1) -> list[int]:
    """A list for test `case`: 1 the shortest, 2 all equal, 3 the longest with both bounds in it."""
    if case == 1:
        return [_num(rng, lo, hi) for _ in range(min_n)]
    if case == 2:
        return [_num(rng, lo, hi)] * rng.randint(max(2, min_n), 6)
    if case == 3:
        xs = [lo, hi] + [_num(rng, lo, hi) for _ in range(LIST_MAX - 2)]
        rng.shuffle(xs)
        return xs
    n = rng.randint(max(3, min_n), 6) if case == 0 else rng.randint(min_n, LIST_MAX)
    return [_num(rng, lo, hi, case) for _ in range(n)]


def _word(rng: random.Random, case: int, alphabet: str = LETTERS) -> str:
    n = rng.randint(3, 7) if case == 0 else rng.randint(1, 20)
    return "".join(rng.choice(alphabet) for _ in range(n))


def _join(xs: Iterable[int]) -> str:
    return " ".join(map(str, xs))


def _list_input(xs: list[int], head: str = "") -> str:
    """The usual layout: a line with n (and the other parameters), then a line with the n numbers."""
    return f"{len(xs)}{head}\n{_join(xs)}\n"


def _yes(ok: bool) -> str:
    return "YES" if ok else "NO"


LIST_IO = f"""
Input
The first line contains an integer n (1 <= n <= {LIST_MAX}). The second line contains n integers
a_1, ..., a_n (-10^9 <= a_i <= 10^9).
"""

WORD_IO = """
Input
One line with a word s of 1 to 20 lowercase English letters.
"""
