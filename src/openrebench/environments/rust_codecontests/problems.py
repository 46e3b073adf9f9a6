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
How a family is declared and the helpers of its generator are in `_family_kit.py`, the validation
families in `_valid_families.py`, the held-out ones in `heldout/families.py`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openrebench.api import OpenRebenchError

from . import _valid_families  # noqa: F401  (registers the validation families, before the held-out ones)
from ._family_kit import FAMILIES, Family

DATASET = "deepmind/code_contests"
DEFAULT_TIME_LIMIT_S = 2.0
DEFAULT_MEMORY_BYTES = 256 << 20
TEST_GROUPS = ("public_tests", "private_tests", "generated_tests")
PUBLIC_KEYS = ("name", "description", "public_tests", "time_limit_s", "memory_limit_bytes")


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
