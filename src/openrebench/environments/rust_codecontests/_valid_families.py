"""The validation families of the mini problems (the agent's split): statements and test generators. A
module of their own, as the held-out ones have `heldout/families.py`, so that problems.py holds only how
problems are made, loaded and written; problems.py imports it, which registers them before any held-out
family, in the order that fixes the shipped problem set."""

from __future__ import annotations

import itertools
import random

from ._family_kit import (
    BIG,
    LIST_BOUND,
    LIST_IO,
    LIST_MAX,
    WORD_IO,
    _edge,
    _family,
    _join,
    _list,
    _list_input,
    _num,
    _word,
    _yes,
)

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
