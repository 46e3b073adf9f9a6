"""The rust_codecontests problems: the generated mini problems are right (each family's expected outputs
agree with an independent reference solution written here), deterministic and split into disjoint
families; CodeContests rows convert and filter as documented; the JSONL files round-trip."""

from __future__ import annotations

import calendar
import itertools
import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from openrebench.api import OpenRebenchError
from openrebench.environments.rust_codecontests import problems

FIXTURE = Path(__file__).parents[1] / "data" / "codecontests_fixture.jsonl"
SEEDS = (0, 1, 2, 17)
GROUPS = ("public_tests", "private_tests", "generated_tests")
BIG = 10**9


# ---- reference solutions, written from the statements (not from the generators) ------------------


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def _scalars(text: str, count: int, lo: int, hi: int) -> list[int]:
    """One line of `count` integers, each within the stated bounds."""
    assert text.endswith("\n") and len(text.splitlines()) == 1, repr(text)
    values = _ints(text)
    assert len(values) == count and all(lo <= v <= hi for v in values), text
    return values


def _listed(text: str, params: int = 0, min_n: int = 1) -> tuple[list[int], list[int]]:
    """The list layout: n and `params` more integers on the first line, then the n integers."""
    assert text.endswith("\n")
    first, second = text.splitlines()
    n, *rest = _ints(first)
    xs = _ints(second)
    assert len(rest) == params and len(xs) == n and min_n <= n <= 20, text
    assert all(-BIG <= v <= BIG for v in xs + rest), text
    return rest, xs


def _word(text: str) -> str:
    assert text.endswith("\n")
    (s,) = text.split()
    assert 1 <= len(s) <= 20 and s.isalpha() and s.islower(), text
    return s


def _yes(ok: bool) -> str:
    return "YES" if ok else "NO"


def _triangle(text: str) -> str:
    a, b, c = sorted(_scalars(text, 3, 1, 10**6))
    return _yes(a + b > c)


def _prefix_sums(text: str) -> str:
    _, xs = _listed(text)
    return " ".join(str(v) for v in itertools.accumulate(xs))


def _repeat_word(text: str) -> str:
    word, k = text.split()
    assert 1 <= int(k) <= 10 and 1 <= len(word) <= 20 and word.isalpha() and word.islower()
    return "".join(word for _ in range(int(k)))


def _power_of_two(text: str) -> str:
    (n,) = _scalars(text, 1, 1, 10**18)
    while n % 2 == 0:
        n //= 2
    return _yes(n == 1)


def _count_digits(text: str) -> str:
    (n,) = _scalars(text, 1, 0, 10**18)
    digits = 1
    while n >= 10:
        n //= 10
        digits += 1
    return str(digits)


def _divisible(text: str) -> str:
    a, b = _ints(text)
    assert 0 <= a <= BIG and 1 <= b <= BIG
    return _yes(a % b == 0)


def _fizzbuzz(text: str) -> str:
    (n,) = _scalars(text, 1, 1, 10**6)
    return ("Fizz" if n % 3 == 0 else "") + ("Buzz" if n % 5 == 0 else "") or str(n)


def _sign(text: str) -> str:
    (n,) = _scalars(text, 1, -BIG, BIG)
    return {1: "positive", -1: "negative", 0: "zero"}[(n > 0) - (n < 0)]


def _count_x(text: str) -> str:
    (x,), xs = _listed(text, params=1)
    return str(sum(1 for v in xs if v == x))


def _count_greater(text: str) -> str:
    (k,), xs = _listed(text, params=1)
    return str(len([v for v in xs if v > k]))


def _top_two_sum(text: str) -> str:
    _, xs = _listed(text, min_n=2)
    first = max(xs)
    rest = list(xs)
    rest.remove(first)
    return str(first + max(rest))


def _count_letter(text: str) -> str:
    s, c = text.split()
    assert len(c) == 1 and c.islower() and 1 <= len(s) <= 20
    return str(len([ch for ch in s if ch == c]))


REFERENCE: dict[str, Callable[[str], str]] = {
    # validation families
    "sum_two": lambda t: str(sum(_scalars(t, 2, -BIG, BIG))),
    "max_two": lambda t: str(max(_scalars(t, 2, -BIG, BIG))),
    "sum_1_to_n": lambda t: str(math.comb(_scalars(t, 1, 1, 10**6)[0] + 1, 2)),
    "digit_sum": lambda t: str(sum(int(d) for d in str(_scalars(t, 1, 0, 10**18)[0]))),
    "is_even": lambda t: _yes(_scalars(t, 1, -BIG, BIG)[0] % 2 == 0),
    "triangle": _triangle,
    "count_up": lambda t: " ".join(map(str, range(1, _scalars(t, 1, 1, 100)[0] + 1))),
    "sum_list": lambda t: str(sum(_listed(t)[1])),
    "min_list": lambda t: str(sorted(_listed(t)[1])[0]),
    "count_even": lambda t: str(len([v for v in _listed(t)[1] if v % 2 == 0])),
    "count_greater": _count_greater,
    "sort_list": lambda t: " ".join(map(str, sorted(_listed(t)[1]))),
    "prefix_sums": _prefix_sums,
    "reverse_word": lambda t: "".join(reversed(_word(t))),
    "count_vowels": lambda t: str(sum(_word(t).count(v) for v in "aeiou")),
    "repeat_word": _repeat_word,
    # held-out families
    "product": lambda t: str(math.prod(_scalars(t, 2, -BIG, BIG))),
    "square": lambda t: str(_scalars(t, 1, -BIG, BIG)[0] ** 2),
    "sign": _sign,
    "rectangle": lambda t: (lambda w, h: f"{w * h} {w + w + h + h}")(*_scalars(t, 2, 1, BIG)),
    "power_of_two": _power_of_two,
    "factorial": lambda t: str(math.factorial(_scalars(t, 1, 0, 12)[0])),
    "gcd": lambda t: str(math.gcd(*_scalars(t, 2, 1, BIG))),
    "count_digits": _count_digits,
    "divisible": _divisible,
    "leap_year": lambda t: _yes(calendar.isleap(_scalars(t, 1, 1, 10**4)[0])),
    "fizzbuzz": _fizzbuzz,
    "min_three": lambda t: str(min(_scalars(t, 3, -BIG, BIG))),
    "count_down": lambda t: " ".join(map(str, reversed(range(1, _scalars(t, 1, 1, 100)[0] + 1)))),
    "times_table": lambda t: " ".join(str(_scalars(t, 1, -BIG, BIG)[0] * i) for i in range(1, 11)),
    "max_list": lambda t: str(sorted(_listed(t)[1])[-1]),
    "range_list": lambda t: (lambda xs: str(max(xs) - min(xs)))(_listed(t)[1]),
    "count_x": _count_x,
    "reverse_list": lambda t: " ".join(map(str, _listed(t)[1][::-1])),
    "is_sorted": lambda t: _yes(_listed(t)[1] == sorted(_listed(t)[1])),
    "distinct_count": lambda t: str(len(set(_listed(t)[1]))),
    "top_two_sum": _top_two_sum,
    "double_sum": lambda t: str(2 * sum(_scalars(t, 2, -BIG, BIG))),
    "triple": lambda t: str(3 * _scalars(t, 1, -BIG, BIG)[0]),
    "next_number": lambda t: str(_scalars(t, 1, -BIG, BIG)[0] + 1),
    "cube": lambda t: str(_scalars(t, 1, -(10**6), 10**6)[0] ** 3),
    "sum_three": lambda t: str(sum(_scalars(t, 3, -BIG, BIG))),
    "sum_of_squares": lambda t: str(sum(x * x for x in _scalars(t, 2, -BIG, BIG))),
    "product_plus": lambda t: (lambda a, b, c: str(a * b + c))(*_scalars(t, 3, -BIG, BIG)),
    "average_two": lambda t: str(sum(_scalars(t, 2, 0, BIG)) // 2),
    "abs_diff": lambda t: (lambda a, b: str(abs(a - b)))(*_scalars(t, 2, -BIG, BIG)),
    "remainder": lambda t: (lambda a, b: str(a % b))(*_scalars(t, 2, 1, BIG)),
    "uppercase": lambda t: "".join(chr(ord(c) - 32) for c in _word(t)),
    "palindrome": lambda t: _yes(all(a == b for a, b in zip(_word(t), reversed(_word(t)), strict=True))),
    "count_letter": _count_letter,
}


def _pairs(record: dict[str, Any]) -> list[tuple[str, str]]:
    return [pair for g in GROUPS
            for pair in zip(record[g]["input"], record[g]["output"], strict=True)]


# ---- the mini problems --------------------------------------------------------------------------


def test_every_family_has_a_reference_solution_here() -> None:
    assert set(REFERENCE) == set(problems.family_by_name())


@pytest.mark.parametrize("name", sorted(problems.family_by_name()))
def test_generated_outputs_match_an_independent_solution(name: str) -> None:
    family = problems.family_by_name()[name]
    for seed in SEEDS:
        record = problems.make_instance(family, seed, n_public=2, n_private=4, n_generated=8)
        for stdin, expected in _pairs(record):
            assert stdin.endswith("\n")
            assert expected.strip(), f"{name} seed {seed}: blank expected output for {stdin!r}"
            assert REFERENCE[name](stdin) == expected.strip(), f"{name} seed {seed}, input {stdin!r}"


def test_yes_no_families_expect_both_answers() -> None:
    for name in ("is_even", "triangle", "power_of_two", "divisible", "leap_year", "is_sorted", "palindrome"):
        answers = {o for seed in SEEDS
                   for _, o in _pairs(problems.make_instance(problems.family_by_name()[name], seed))}
        assert answers == {"YES", "NO"}, name


def test_hidden_tests_reach_the_edge_cases() -> None:
    def inputs(name: str) -> list[str]:
        record = problems.make_instance(problems.family_by_name()[name], 0)
        return record["private_tests"]["input"]

    assert "1\n" in inputs("sum_1_to_n") and "0\n" in inputs("digit_sum")
    assert any(s.startswith("1\n") for s in inputs("min_list"))  # a list of one
    assert any(s.startswith("20\n") for s in inputs("sort_list"))  # the longest
    sums = problems.make_instance(problems.family_by_name()["sum_list"], 0)["private_tests"]["output"]
    assert any(abs(int(o)) > 2**31 for o in sums)  # an i32 accumulator overflows


def test_split_has_26_valid_and_24_held_out_families_disjoint() -> None:
    valid, test = problems.mini_problems(0)
    assert len(valid) == 26 and len(test) == 24
    assert {r["family"] for r in valid}.isdisjoint({r["family"] for r in test})
    assert {r["name"] for r in valid}.isdisjoint({r["name"] for r in test})
    assert [f.name for f in problems.families() if f.split == "valid"] == [r["family"] for r in valid]
    assert [f.name for f in problems.families() if f.split == "test"] == [r["family"] for r in test]


def test_mini_problems_are_deterministic_and_differ_across_seeds() -> None:
    assert problems.mini_problems(3) == problems.mini_problems(3)
    (valid_a, test_a), (valid_b, _) = problems.mini_problems(0), problems.mini_problems(1)
    assert [r["name"] for r in valid_a] == [f"mini-{r['family']}-0" for r in valid_a]
    assert sum(a["public_tests"] != b["public_tests"] for a, b in zip(valid_a, valid_b, strict=True)) > 12
    json.dumps(test_a)  # serialisable as it is


def test_description_quotes_the_first_public_test() -> None:
    valid, test = problems.mini_problems(5)
    for r in valid + test:
        stdin, stdout = r["public_tests"]["input"][0], r["public_tests"]["output"][0]
        assert f"Input\n{stdin}Output\n{stdout}" in r["description"], r["name"]
        assert "Input\n" in r["description"].split("Example")[0]  # the format section comes first
        assert (r["time_limit_s"], r["memory_limit_bytes"], r["source"]) == (2.0, 256 << 20, "mini")


def test_make_instance_counts_tests_and_needs_a_public_one() -> None:
    r = problems.make_instance(problems.family_by_name()["gcd"], 9, n_public=2, n_private=3, n_generated=7)
    assert [len(r[g]["input"]) for g in GROUPS] == [2, 3, 7]
    assert [len(r[g]["output"]) for g in GROUPS] == [2, 3, 7]
    with pytest.raises(ValueError):
        problems.make_instance(problems.family_by_name()["gcd"], 9, n_public=0)


# ---- CodeContests ---------------------------------------------------------------------------------


def _fixture_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_convert_row_keeps_the_record_fields_and_converts_limits() -> None:
    apples, secret, _, echo = (problems.convert_row(r) for r in _fixture_rows())
    assert set(apples) == {"name", "description", *GROUPS, "time_limit_s", "memory_limit_bytes", "source"}
    assert apples["time_limit_s"] == 1.5 and apples["memory_limit_bytes"] == 128 << 20
    assert apples["source"] == "codecontests"
    assert apples["public_tests"] == {"input": ["2 3\n"], "output": ["5\n"]}
    assert secret["time_limit_s"] == 2.0 and secret["public_tests"] == {"input": [], "output": []}
    assert echo["time_limit_s"] == 2.0 and echo["memory_limit_bytes"] == 256 << 20  # null and 0: defaults
    zero = problems.convert_row({**_fixture_rows()[0], "time_limit": {"seconds": 0, "nanos": 0}})
    assert zero["time_limit_s"] == 2.0


def test_easy_filter_drops_problems_without_examples_or_with_blank_answers() -> None:
    records = [problems.convert_row(r) for r in _fixture_rows()]
    assert [r["name"] for r in problems.easy_filter(records)] == ["9001_A. Two Apples", "9001_D. Echo"]


def test_load_codecontests_from_injected_rows() -> None:
    easy = problems.load_codecontests("test", rows=_fixture_rows())
    every = problems.load_codecontests("test", easy=False, rows=iter(_fixture_rows()))
    assert len(easy) == 2 and len(every) == 4


def test_load_codecontests_asks_the_hub_for_the_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(name: str, split: str) -> list[dict[str, Any]]:
        calls.append((name, split))
        return _fixture_rows()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert len(problems.load_codecontests("valid")) == 2
    assert calls == [("deepmind/code_contests", "valid")]


def test_load_codecontests_without_datasets_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(OpenRebenchError, match="datasets") as e:
        problems.load_codecontests("test")
    assert "\n" not in str(e.value)


def test_load_codecontests_offline_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(name: str, split: str) -> list[dict[str, Any]]:
        raise ConnectionError("no route to huggingface.co\n(details)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(OpenRebenchError, match=r"no route to huggingface\.co") as e:
        problems.load_codecontests("test")
    assert "\n" not in str(e.value)


# ---- files and views ------------------------------------------------------------------------------


def test_records_round_trip_through_jsonl(tmp_path: Path) -> None:
    valid, _ = problems.mini_problems(0)
    records = valid + [problems.convert_row(r) for r in _fixture_rows()]
    path = tmp_path / "sub" / "valid.jsonl"
    problems.write_jsonl(path, records)
    assert problems.read_jsonl(path) == records
    assert len(path.read_text().splitlines()) == len(records)


def test_read_jsonl_names_the_broken_line(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    path.write_text('{"name": "a"}\n\n{"name": \n')
    with pytest.raises(OpenRebenchError, match=r"line 3"):
        problems.read_jsonl(path)
    path.write_text('{"name": "a"}\n[1, 2]\n')
    with pytest.raises(OpenRebenchError, match=r"line 2"):
        problems.read_jsonl(path)


def test_public_view_hides_the_hidden_tests() -> None:
    for record in [problems.mini_problems(0)[1][0], problems.convert_row(_fixture_rows()[0])]:
        view = problems.public_view(record)
        assert set(view) == {"name", "description", "public_tests", "time_limit_s", "memory_limit_bytes"}
        assert view["public_tests"] == record["public_tests"] and view["name"] == record["name"]
        assert "private_tests" in record and "generated_tests" in record  # dropped from the view only
