"""The problems of rust_codecontests, as JSONL records: DeepMind's CodeContests (full tier) or generated
beginner problems (mini tier). Trusted side: the scorer and the asset builder use it; the agent's scaffold
sees only `public_view` of a problem.

A record: `name`, `description` (the statement, with its input/output format and one example),
`public_tests`, `private_tests`, `generated_tests` (each `{"input": [...], "output": [...]}`, stdin text
and expected stdout, compared after trimming whitespace), `time_limit_s`, `memory_limit_bytes`, `source`
("codecontests" or "mini") and, for mini, the problem's `family`.

The mini problems come in families, each a statement and a generator of (input, expected output). The
validation families and the held-out (test) families are disjoint, so a scaffold tuned on the
validation problems has not seen a held-out problem's kind, only its difficulty: the scaffolding has to
generalise as it must on CodeContests, where the splits are different contest problems. Each
generator's case 0 is a small readable example (the public test, quoted in the statement), cases 1-4
the family's edge cases (n = 1, zero, negatives, the bounds: the private tests) and later cases random.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.api import OpenRebenchError

DATASET = "deepmind/code_contests"
DEFAULT_TIME_LIMIT_S = 2.0
DEFAULT_MEMORY_BYTES = 256 << 20
TEST_GROUPS = ("public_tests", "private_tests", "generated_tests")
PUBLIC_KEYS = ("name", "description", "public_tests", "time_limit_s", "memory_limit_bytes")
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

# ---- validation families -------------------------------------------------------------------------


@_family("sum_two", "valid", """
You are given two integers a and b. Print their sum.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print a + b.
""")
def _sum_two(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, 0), (-7, 7), (BIG, BIG), (-BIG, -BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(a + b)


@_family("max_two", "valid", """
You are given two integers a and b. Print the larger of them.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print the maximum of a and b.
""")
def _max_two(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(5, 5), (-3, -8), (0, -1), (-BIG, BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(max(a, b))


@_family("sum_1_to_n", "valid", """
Compute the sum of all integers from 1 to n.

Input
One line with an integer n (1 <= n <= 10^6).

Output
Print 1 + 2 + ... + n.
""")
def _sum_1_to_n(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(1,), (2,), (10**6,), (999_999,)]) or (_num(rng, 1, 10**6, case),)
    return f"{n}\n", str(n * (n + 1) // 2)


@_family("digit_sum", "valid", """
Compute the sum of the decimal digits of a non-negative integer n.

Input
One line with an integer n (0 <= n <= 10^18).

Output
Print the sum of the digits of n.
""")
def _digit_sum(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (7,), (10**18,), (999_999_999_999_999_999,)]) or (
        rng.randint(10, 999) if case == 0 else rng.randint(0, 10 ** rng.randint(1, 18)),)
    return f"{n}\n", str(sum(int(d) for d in str(n)))


@_family("is_even", "valid", """
Decide whether an integer n is even.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print YES if n is even, otherwise print NO.
""")
def _is_even(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-3,), (-4,), (BIG,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", _yes(n % 2 == 0)


@_family("triangle", "valid", """
Three sticks have lengths a, b and c. Decide whether they form a triangle of positive area, that is,
whether each length is smaller than the sum of the other two.

Input
One line with three integers a, b and c (1 <= a, b, c <= 10^6).

Output
Print YES if the sticks form a triangle of positive area, otherwise print NO.
""")
def _triangle(rng: random.Random, case: int) -> tuple[str, str]:
    a, b, c = _edge(case, [(1, 1, 1), (1, 2, 3), (3, 4, 5), (10**6, 1, 10**6)]) or (
        rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 12))
    return f"{a} {b} {c}\n", _yes(a < b + c and b < a + c and c < a + b)


@_family("count_up", "valid", """
Print the integers from 1 to n in increasing order.

Input
One line with an integer n (1 <= n <= 100).

Output
Print 1, 2, ..., n on one line, separated by spaces.
""")
def _count_up(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(1,), (2,), (100,)]) or (rng.randint(3, 8) if case == 0 else rng.randint(1, 100),)
    return f"{n}\n", _join(range(1, n + 1))


@_family("sum_list", "valid", """
Compute the sum of n integers.
""" + LIST_IO + """
Output
Print the sum a_1 + a_2 + ... + a_n.
""")
def _sum_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [BIG] * LIST_MAX if case == 4 else _list(rng, case)
    return _list_input(xs), str(sum(xs))


@_family("min_list", "valid", """
Find the smallest of n integers.
""" + LIST_IO + """
Output
Print the smallest of the n integers.
""")
def _min_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case)
    return _list_input(xs), str(min(xs))


@_family("count_even", "valid", """
Count the even numbers among n integers.
""" + LIST_IO + """
Output
Print how many of the n integers are even (zero and negative numbers count too).
""")
def _count_even(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [0, -2, -1, 3, -4] if case == 4 else _list(rng, case)
    return _list_input(xs), str(sum(1 for x in xs if x % 2 == 0))


@_family("count_greater", "valid", """
You are given n integers and a threshold k. Count how many of the integers are strictly greater than k.

Input
The first line contains two integers n and k (1 <= n <= 20, -10^9 <= k <= 10^9). The second line contains
n integers a_1, ..., a_n (-10^9 <= a_i <= 10^9).

Output
Print the number of indices i with a_i > k.
""")
def _count_greater(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case, -100, 100)
    k = xs[0] if case == 2 else -BIG if case == 3 else _num(rng, -100, 100, case)
    return _list_input(xs, f" {k}"), str(sum(1 for x in xs if x > k))


@_family("sort_list", "valid", """
Sort n integers in non-decreasing order.
""" + LIST_IO + """
Output
Print the n integers sorted in non-decreasing order, on one line, separated by spaces.
""")
def _sort_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case)
    return _list_input(xs), _join(sorted(xs))


@_family("prefix_sums", "valid", """
Compute the prefix sums of a list of n integers.
""" + LIST_IO + """
Output
Print n integers on one line, separated by spaces: the i-th is a_1 + a_2 + ... + a_i.
""")
def _prefix_sums(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [BIG] * LIST_MAX if case == 4 else _list(rng, case)
    sums, total = [], 0
    for x in xs:
        total += x
        sums.append(total)
    return _list_input(xs), _join(sums)


@_family("reverse_word", "valid", """
Print a word backwards.
""" + WORD_IO + """
Output
Print the letters of s in reverse order.
""")
def _reverse_word(rng: random.Random, case: int) -> tuple[str, str]:
    (s,) = _edge(case, [("a",), ("ab",), ("level",)]) or (_word(rng, case),)
    return f"{s}\n", s[::-1]


@_family("count_vowels", "valid", """
Count the vowels in a word. The vowels are a, e, i, o and u.
""" + WORD_IO + """
Output
Print the number of vowels in s.
""")
def _count_vowels(rng: random.Random, case: int) -> tuple[str, str]:
    (s,) = _edge(case, [("bcd",), ("aeiou",), ("y",), ("a",)]) or (_word(rng, case, "aeioubcdfgkmnrsty"),)
    return f"{s}\n", str(sum(1 for ch in s if ch in "aeiou"))


@_family("repeat_word", "valid", """
Print a word k times in a row.

Input
One line with a word s of 1 to 20 lowercase English letters and an integer k (1 <= k <= 10).

Output
Print s repeated k times, with nothing between the copies.
""")
def _repeat_word(rng: random.Random, case: int) -> tuple[str, str]:
    s, k = _edge(case, [("a", 1), ("ab", 10), ("xyz", 1)]) or (_word(rng, case), rng.randint(1, 10))
    return f"{s} {k}\n", s * k


@_family("leap_year", "valid", """
Decide whether a year is a leap year in the Gregorian calendar: a year is a leap year if it is divisible
by 4, except years divisible by 100, which are leap years only if they are also divisible by 400.

Input
One line with an integer y (1 <= y <= 10^4).

Output
Print YES if y is a leap year, otherwise print NO.
""")
def _leap_year(rng: random.Random, case: int) -> tuple[str, str]:
    (y,) = _edge(case, [(1900,), (2000,), (2023,), (4,)]) or (
        rng.randint(1, 10**4) if rng.random() < 0.5 else 4 * rng.randint(1, 2500),)
    return f"{y}\n", _yes(y % 4 == 0 and (y % 100 != 0 or y % 400 == 0))


@_family("fizzbuzz", "valid", """
Play one turn of FizzBuzz.

Input
One line with an integer n (1 <= n <= 10^6).

Output
Print FizzBuzz if n is divisible by both 3 and 5, Fizz if only by 3, Buzz if only by 5, and otherwise the
number n itself.
""")
def _fizzbuzz(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(15,), (3,), (5,), (1,)]) or (rng.randint(1, 30 if case == 0 else 10**6),)
    out = "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)
    return f"{n}\n", out


@_family("times_table", "valid", """
Print the first ten multiples of an integer n.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print n * 1, n * 2, ..., n * 10 on one line, separated by spaces.
""")
def _times_table(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-3,), (BIG,), (1,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", _join(n * i for i in range(1, 11))


@_family("is_sorted", "valid", """
Decide whether a list of n integers is sorted in non-decreasing order.
""" + LIST_IO + """
Output
Print YES if a_1 <= a_2 <= ... <= a_n, otherwise print NO.
""")
def _is_sorted(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [3, 2, 1] if case == 4 else _list(rng, case, -100, 100)
    if case not in (1, 2, 4) and rng.random() < 0.5:
        xs.sort()
    return _list_input(xs), _yes(all(a <= b for a, b in itertools.pairwise(xs)))


@_family("distinct_count", "valid", """
Count the distinct values in a list of n integers.
""" + LIST_IO + """
Output
Print the number of distinct values among the n integers.
""")
def _distinct_count(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case, -10, 10)
    if case == 3:
        xs = [LIST_BOUND if x == 10 else -LIST_BOUND if x == -10 else x for x in xs]
    return _list_input(xs), str(len(set(xs)))


@_family("top_two_sum", "valid", """
You are given n integers. Print the sum of the two largest of them (if the largest value occurs twice,
the two largest are both that value).

Input
The first line contains an integer n (2 <= n <= 20). The second line contains n integers a_1, ..., a_n
(-10^9 <= a_i <= 10^9).

Output
Print the sum of the two largest integers.
""")
def _top_two_sum(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [BIG, 1, BIG] if case == 4 else _list(rng, case, min_n=2)
    a, b = sorted(xs)[-2:]
    return _list_input(xs), str(a + b)


# ---- formula families: arithmetic on the given integers (the shape a small model can sometimes adapt
# from a worked example, so that the mini tier's scaffolds can be told apart; the held-out split has its
# own) ------------------------------------------------------------------------------------------------


@_family("double_sum", "valid", """
You are given two integers a and b. Print twice their sum.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print 2 * (a + b).
""")
def _double_sum(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, 0), (-4, 9), (BIG, BIG), (-BIG, 1)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(2 * (a + b))


@_family("triple", "valid", """
You are given an integer n. Print three times n.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print 3 * n.
""")
def _triple(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-7,), (BIG,), (-BIG,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", str(3 * n)


@_family("next_number", "valid", """
You are given an integer n. Print the integer that comes right after it.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print n + 1.
""")
def _next_number(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-1,), (BIG,), (-BIG,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", str(n + 1)


@_family("cube", "valid", """
You are given an integer n. Print its cube.

Input
One line with an integer n (-10^6 <= n <= 10^6).

Output
Print n * n * n.
""")
def _cube(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-3,), (10**6,), (-(10**6),)]) or (_num(rng, -(10**6), 10**6, case),)
    return f"{n}\n", str(n**3)


# ---- the held-out (test) families live in heldout/, which no sandbox can read: their statements and
# generators are the hidden tests, and a scaffold that could read them could hand-write every answer.


def families() -> list[Family]:
    """Every family, the held-out ones included (trusted side only: the asset builder and tests; inside a
    sandbox `heldout/` is an empty folder and this raises)."""
    try:
        from .heldout import families as _heldout  # noqa: F401  (registers the held-out families)
    except ImportError as e:
        raise OpenRebenchError("rust_codecontests' held-out problem families are not readable here") from e
    return FAMILIES


def family_by_name() -> dict[str, Family]:
    return {f.name: f for f in families()}


def _rng(family: Family, seed: int) -> random.Random:
    """Seeded from a digest, not `hash()`: str hashing is salted per process, and the problems must be
    the same on every machine."""
    digest = hashlib.sha256(f"rust_codecontests/{family.name}/{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _tests(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    return {"input": [i for i, _ in pairs], "output": [o for _, o in pairs]}


def make_instance(family: Family, seed: int, n_public: int = 1, n_private: int = 4,
                  n_generated: int = 5) -> dict[str, Any]:
    """One mini problem. The public tests are small examples (case 0), the private ones the family's edge
    cases (cases 1..n_private), the generated ones random; the statement quotes the first public test."""
    if n_public < 1:
        raise ValueError("a problem needs a public test: its statement quotes the first one")
    rng = _rng(family, seed)
    public = [family.generate(rng, 0) for _ in range(n_public)]
    private = [family.generate(rng, 1 + i) for i in range(n_private)]
    generated = [family.generate(rng, 1 + n_private + i) for i in range(n_generated)]
    example_in, example_out = public[0]
    description = f"{family.statement}\n\nExample\nInput\n{example_in}Output\n{example_out}\n"
    return {"name": f"mini-{family.name}-{seed}", "description": description,
            "public_tests": _tests(public), "private_tests": _tests(private),
            "generated_tests": _tests(generated), "time_limit_s": DEFAULT_TIME_LIMIT_S,
            "memory_limit_bytes": DEFAULT_MEMORY_BYTES, "source": "mini", "family": family.name}


def mini_problems(seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(valid, test): one problem per validation family and one per held-out family."""
    every = families()
    valid = [make_instance(f, seed) for f in every if f.split == "valid"]
    test = [make_instance(f, seed) for f in every if f.split == "test"]
    return valid, test


# ---- CodeContests ---------------------------------------------------------------------------------


def _row_tests(tests: Any) -> dict[str, list[str]]:
    """A test group as pairs: an input without its output (or the reverse) cannot be judged."""
    tests = tests or {}
    pairs = list(zip(tests.get("input") or [], tests.get("output") or [], strict=False))
    return {"input": [str(i) for i, _ in pairs], "output": [str(o) for _, o in pairs]}


def convert_row(row: dict[str, Any]) -> dict[str, Any]:
    """A CodeContests row as a problem record; the solutions, ratings and other metadata are dropped
    (the solutions would be an answer key in the agent's validation file)."""
    limit = row.get("time_limit") or {}
    seconds = float(limit.get("seconds") or 0) + float(limit.get("nanos") or 0) / 1e9
    return {"name": str(row["name"]), "description": str(row["description"]),
            **{group: _row_tests(row.get(group)) for group in TEST_GROUPS},
            "time_limit_s": seconds if seconds > 0 else DEFAULT_TIME_LIMIT_S,
            "memory_limit_bytes": int(row.get("memory_limit_bytes") or 0) or DEFAULT_MEMORY_BYTES,
            "source": "codecontests"}


def easy_filter(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's filter as far as it can be reproduced: keep problems with at least one public test
    (the example a scaffold is given) and no blank expected output in any test (after trimming, a blank
    expectation is passed by a program that prints nothing). The paper names no other criterion, and its
    held-out set after filtering, 165 problems, is the whole CodeContests test split: this filter is
    expected to keep all of it (not checked here: that needs the dataset)."""
    def keep(r: dict[str, Any]) -> bool:
        if not r["public_tests"]["input"]:
            return False
        return all(o.strip() for g in TEST_GROUPS for o in r[g]["output"])
    return [r for r in records if keep(r)]


def load_codecontests(split: str, easy: bool = True, rows: Iterable[dict[str, Any]] | None = None
                      ) -> list[dict[str, Any]]:
    """The CodeContests `split` ("train", "valid" or "test") as records, filtered with `easy_filter`
    when `easy`. `rows` stands in for the dataset (tests, or a copy loaded some other way)."""
    if rows is None:
        try:
            import datasets
        except ImportError:
            raise OpenRebenchError("the full rust_codecontests tier needs the `datasets` package "
                                   "(pip install datasets) to load deepmind/code_contests") from None
        try:
            rows = datasets.load_dataset(DATASET, split=split)
        except Exception as e:  # network, hub, cache: any of them ends the build with one line
            raise OpenRebenchError(f"cannot load {DATASET} (split {split}): {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}") from None
    records = [convert_row(row) for row in rows]
    return easy_filter(records) if easy else records


# ---- files -----------------------------------------------------------------------------------------


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """One record a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (blank lines skipped); a broken line is named in a one-line error."""
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise OpenRebenchError(f"{path}, line {number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise OpenRebenchError(f"{path}, line {number}: a {type(record).__name__}, not a record")
            records.append(record)
    return records


def public_view(problem: dict[str, Any]) -> dict[str, Any]:
    """What a contestant sees of a problem: statement, examples and limits, never the hidden tests."""
    return {key: problem[key] for key in PUBLIC_KEYS}
