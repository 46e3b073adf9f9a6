"""The held-out (test) families of the mini problems: statements and test generators. Only the trusted
side reads them (the asset builder writes protected/test.jsonl from them); `heldout/` is masked in the
agent's and the scorer's sandboxes. Importing this module registers them after the validation families,
in the order that fixes the shipped problem set."""

from __future__ import annotations

import random

from .. import _valid_families  # noqa: F401  (registers the validation families first)
from .._family_kit import BIG, LIST_IO, WORD_IO, _edge, _family, _join, _list, _list_input, _num, _word, _yes


@_family("product", "test", """
You are given two integers a and b. Print their product.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print a * b.
""")
def _product(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, -5), (-3, -4), (BIG, BIG), (-BIG, BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(a * b)


@_family("square", "test", """
Print the square of an integer n.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print n * n.
""")
def _square(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-6,), (BIG,), (-BIG,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", str(n * n)


@_family("sign", "test", """
Tell whether an integer n is positive, negative or zero.

Input
One line with an integer n (-10^9 <= n <= 10^9).

Output
Print positive if n > 0, negative if n < 0 and zero if n = 0.
""")
def _sign(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (-1,), (1,), (-BIG,)]) or (_num(rng, -BIG, BIG, case),)
    return f"{n}\n", "positive" if n > 0 else "negative" if n < 0 else "zero"


@_family("rectangle", "test", """
A rectangle has width w and height h. Print its area and its perimeter.

Input
One line with two integers w and h (1 <= w, h <= 10^9).

Output
Print two integers separated by a space: the area w * h and the perimeter 2 * (w + h).
""")
def _rectangle(rng: random.Random, case: int) -> tuple[str, str]:
    w, h = _edge(case, [(1, 1), (1, 7), (BIG, BIG)]) or (_num(rng, 1, BIG, case), _num(rng, 1, BIG, case))
    return f"{w} {h}\n", f"{w * h} {2 * (w + h)}"


@_family("power_of_two", "test", """
Decide whether a positive integer n is a power of two (1, 2, 4, 8, ...).

Input
One line with an integer n (1 <= n <= 10^18).

Output
Print YES if n is a power of two, otherwise print NO.
""")
def _power_of_two(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(1,), (6,), (2**59,), (10**18,)]) or (
        2 ** rng.randint(0, 10 if case == 0 else 59) if rng.random() < 0.5
        else rng.randint(1, 100 if case == 0 else 10**18),)
    return f"{n}\n", _yes(n & (n - 1) == 0)


@_family("factorial", "test", """
Compute n! = 1 * 2 * ... * n (and 0! = 1).

Input
One line with an integer n (0 <= n <= 12).

Output
Print n!.
""")
def _factorial(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (1,), (12,)]) or (rng.randint(2, 12),)
    result = 1
    for i in range(2, n + 1):
        result *= i
    return f"{n}\n", str(result)


@_family("gcd", "test", """
Compute the greatest common divisor of two positive integers a and b.

Input
One line with two integers a and b (1 <= a, b <= 10^9).

Output
Print the largest integer that divides both a and b.
""")
def _gcd(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(1, 1), (7, 7), (13, 1_000_000_000), (10**9, 5 * 10**8)]) or (0, 0)
    if a == 0:
        g = rng.randint(1, 12 if case == 0 else 1000)
        top = 12 if case == 0 else BIG // g
        a, b = g * rng.randint(1, top), g * rng.randint(1, top)
    x, y = a, b
    while y:
        x, y = y, x % y
    return f"{a} {b}\n", str(x)


@_family("count_digits", "test", """
Count the decimal digits of a non-negative integer n.

Input
One line with an integer n (0 <= n <= 10^18).

Output
Print the number of digits of n (0 has one digit).
""")
def _count_digits(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(0,), (9,), (10,), (10**18,)]) or (
        rng.randint(10, 99_999) if case == 0 else rng.randint(0, 10 ** rng.randint(1, 18)),)
    return f"{n}\n", str(len(str(n)))


@_family("divisible", "test", """
Decide whether a is divisible by b.

Input
One line with two integers a and b (0 <= a <= 10^9, 1 <= b <= 10^9).

Output
Print YES if b divides a (a is a multiple of b), otherwise print NO.
""")
def _divisible(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, 5), (7, 7), (6, 4), (BIG, 1)]) or (0, 0)
    if b == 0:
        b = rng.randint(1, 12 if case == 0 else 1000)
        a = b * rng.randint(0, 12 if case == 0 else BIG // b - 1)
        if rng.random() < 0.5:
            a += rng.randint(0, b - 1)
    return f"{a} {b}\n", _yes(a % b == 0)


@_family("min_three", "test", """
Print the smallest of three integers.

Input
One line with three integers a, b and c (-10^9 <= a, b, c <= 10^9).

Output
Print the minimum of a, b and c.
""")
def _min_three(rng: random.Random, case: int) -> tuple[str, str]:
    a, b, c = _edge(case, [(4, 4, 4), (3, 2, 1), (0, -1, 5), (BIG, -BIG, 0)]) or tuple(
        _num(rng, -BIG, BIG, case) for _ in range(3))
    return f"{a} {b} {c}\n", str(min(a, b, c))


@_family("count_down", "test", """
Print the integers from n down to 1.

Input
One line with an integer n (1 <= n <= 100).

Output
Print n, n - 1, ..., 1 on one line, separated by spaces.
""")
def _count_down(rng: random.Random, case: int) -> tuple[str, str]:
    (n,) = _edge(case, [(1,), (2,), (100,)]) or (rng.randint(3, 8) if case == 0 else rng.randint(1, 100),)
    return f"{n}\n", _join(range(n, 0, -1))


@_family("max_list", "test", """
Find the largest of n integers.
""" + LIST_IO + """
Output
Print the largest of the n integers.
""")
def _max_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = [-5, -2, -9] if case == 4 else _list(rng, case)
    return _list_input(xs), str(max(xs))


@_family("range_list", "test", """
Find the range of n integers: the largest minus the smallest.
""" + LIST_IO + """
Output
Print the difference between the largest and the smallest of the n integers.
""")
def _range_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case)
    return _list_input(xs), str(max(xs) - min(xs))


@_family("count_x", "test", """
Count how many times the integer x occurs in a list of n integers.

Input
The first line contains two integers n and x (1 <= n <= 20, -10^9 <= x <= 10^9). The second line contains
n integers a_1, ..., a_n (-10^9 <= a_i <= 10^9).

Output
Print the number of indices i with a_i = x.
""")
def _count_x(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case, -5, 5)
    x = xs[0] if case == 2 else 1000 if case == 3 else rng.randint(-5, 5)
    return _list_input(xs, f" {x}"), str(xs.count(x))


@_family("reverse_list", "test", """
Print a list of n integers in reverse order.
""" + LIST_IO + """
Output
Print the n integers in reverse order (a_n first), on one line, separated by spaces.
""")
def _reverse_list(rng: random.Random, case: int) -> tuple[str, str]:
    xs = _list(rng, case)
    return _list_input(xs), _join(reversed(xs))


@_family("uppercase", "test", """
Print a word in capital letters.
""" + WORD_IO + """
Output
Print s with every letter replaced by its uppercase form.
""")
def _uppercase(rng: random.Random, case: int) -> tuple[str, str]:
    (s,) = _edge(case, [("a",), ("zz",), ("abcdefghijklmnopqrst",)]) or (_word(rng, case),)
    return f"{s}\n", s.upper()


@_family("palindrome", "test", """
Decide whether a word is a palindrome, that is, reads the same backwards.
""" + WORD_IO + """
Output
Print YES if s is a palindrome, otherwise print NO.
""")
def _palindrome(rng: random.Random, case: int) -> tuple[str, str]:
    (s,) = _edge(case, [("a",), ("ab",), ("abba",), ("abca",)]) or (_word(rng, case, "abc"),)
    if case not in range(1, 5) and rng.random() < 0.5:
        s = s[: (len(s) + 1) // 2] + s[: len(s) // 2][::-1]
    return f"{s}\n", _yes(s == s[::-1])


@_family("count_letter", "test", """
Count how many times a letter occurs in a word.

Input
One line with a word s of 1 to 20 lowercase English letters and a lowercase letter c, separated by a space.

Output
Print the number of positions of s that hold the letter c.
""")
def _count_letter(rng: random.Random, case: int) -> tuple[str, str]:
    s, c = _edge(case, [("a", "a"), ("abc", "z"), ("zzzz", "z")]) or (
        _word(rng, case, "abcd"), rng.choice("abcde"))
    return f"{s} {c}\n", str(s.count(c))


@_family("sum_three", "test", """
You are given three integers a, b and c. Print their sum.

Input
One line with three integers a, b and c (-10^9 <= a, b, c <= 10^9).

Output
Print a + b + c.
""")
def _sum_three(rng: random.Random, case: int) -> tuple[str, str]:
    a, b, c = _edge(case, [(0, 0, 0), (-5, 2, 3), (BIG, BIG, BIG), (-BIG, -BIG, -BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b} {c}\n", str(a + b + c)


@_family("sum_of_squares", "test", """
You are given two integers a and b. Print the sum of their squares.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print a * a + b * b.
""")
def _sum_of_squares(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, 0), (-3, 4), (BIG, BIG), (-BIG, 1)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(a * a + b * b)


@_family("product_plus", "test", """
You are given three integers a, b and c. Print a times b, plus c.

Input
One line with three integers a, b and c (-10^9 <= a, b, c <= 10^9).

Output
Print a * b + c.
""")
def _product_plus(rng: random.Random, case: int) -> tuple[str, str]:
    a, b, c = _edge(case, [(0, 5, 0), (-2, 3, -4), (BIG, BIG, BIG), (-BIG, BIG, -BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b} {c}\n", str(a * b + c)


@_family("average_two", "test", """
You are given two non-negative integers a and b. Print their average, rounded down.

Input
One line with two integers a and b (0 <= a, b <= 10^9).

Output
Print (a + b) / 2, rounded down.
""")
def _average_two(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(0, 0), (3, 4), (BIG, BIG), (0, 1)]) or (
        _num(rng, 0, BIG, case), _num(rng, 0, BIG, case))
    return f"{a} {b}\n", str((a + b) // 2)


@_family("abs_diff", "test", """
You are given two integers a and b. Print the absolute value of their difference.

Input
One line with two integers a and b (-10^9 <= a, b <= 10^9).

Output
Print |a - b|.
""")
def _abs_diff(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(5, 5), (2, 9), (-BIG, BIG), (BIG, -BIG)]) or (
        _num(rng, -BIG, BIG, case), _num(rng, -BIG, BIG, case))
    return f"{a} {b}\n", str(abs(a - b))


@_family("remainder", "test", """
You are given two positive integers a and b. Print the remainder of a divided by b.

Input
One line with two integers a and b (1 <= a, b <= 10^9).

Output
Print a mod b.
""")
def _remainder(rng: random.Random, case: int) -> tuple[str, str]:
    a, b = _edge(case, [(7, 7), (3, 10), (BIG, 1), (BIG, BIG - 1)]) or (
        _num(rng, 1, BIG, case), _num(rng, 1, BIG, case))
    return f"{a} {b}\n", str(a % b)
