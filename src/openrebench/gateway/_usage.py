"""The usage log: one JSON line per request the gateway answered, in the run's directory.

The log is the budget's memory: a gateway started again on the same file counts what was spent before
it. Each grant's budget counts only its own rows (those naming its `grant` id), so a run's agent and
each of its scorings spend apart, in one file. A line torn by a crash is skipped on reading (and the
next row starts on a line of its own), never fatal: losing one request's tokens is better than
refusing a run its log.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Totals:
    """What a log adds up to. `priced` is false once tokens of a model without a known price were used
    (they count as costing nothing, so `cost_usd` is then a lower bound)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    failures: int = 0
    priced: bool = True

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens}

    def add(self, row: Mapping[str, Any]) -> Totals:
        prompt, completion = int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0)
        return Totals(self.prompt_tokens + prompt, self.completion_tokens + completion,
                      self.cost_usd + float(row.get("cost_usd") or 0.0), self.requests + 1,
                      self.failures + (row.get("status") != 200),
                      self.priced and (bool(row.get("priced", True)) or prompt + completion == 0))


def cost_usd(price: Mapping[str, float] | None, prompt_tokens: int, completion_tokens: int) -> float:
    """Dollars for the tokens at a price in US$ per million input and output tokens (unknown: 0)."""
    if price is None:
        return 0.0
    return (prompt_tokens * price.get("input", 0.0) + completion_tokens * price.get("output", 0.0)) / 1e6


class UsageLog:
    """Appends rows to `path` (JSON lines) and keeps their totals, starting from what the file holds."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._totals = Totals()
        self._by_grant: dict[str | None, Totals] = {}
        # tokens and dollars the requests in flight hold (not in the file yet), by grant id
        self._held: dict[str | None, tuple[int, float]] = {}
        self._skipped = 0
        needs_newline = False
        if self.path.exists():
            data = self.path.read_bytes()
            needs_newline = bool(data) and not data.endswith(b"\n")
            for line in data.splitlines():
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError("not an object")
                    self._count(row)
                except (ValueError, TypeError, UnicodeDecodeError):
                    self._skipped += 1
            if self._skipped:
                logger.warning("%s: skipped %d unreadable line(s)", self.path, self._skipped)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if needs_newline:  # a torn last line: the next row must not be glued to it
            self._append(b"\n")

    def _count(self, row: Mapping[str, Any]) -> None:
        self._totals = self._totals.add(row)
        key = row.get("grant") if isinstance(row.get("grant"), str) else None
        self._by_grant[key] = self._by_grant.get(key, Totals()).add(row)

    def _append(self, data: bytes) -> None:
        # Opened per row (about 20 µs): no descriptor to outlive a revoked grant or a closed gateway.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @property
    def skipped(self) -> int:
        """Lines of the file that could not be read when it was opened."""
        return self._skipped

    def record(self, *, grant: str | None, role: str | None, model: str | None, endpoint: str,
               status: int, prompt_tokens: int = 0, completion_tokens: int = 0,
               price: Mapping[str, float] | None = None, latency_s: float = 0.0,
               error: str | None = None, phase: str | None = None) -> dict[str, Any]:
        """Append one row (one `write`, so a row is whole or torn, never interleaved) and count it."""
        row = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "grant": grant,
               "phase": phase, "role": role, "model": model, "endpoint": endpoint,
               "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
               "cost_usd": cost_usd(price, prompt_tokens, completion_tokens),
               "priced": None if model is None else price is not None,
               "latency_s": round(latency_s, 6), "status": status, "error": error}
        line = (json.dumps(row) + "\n").encode()
        with self._lock:
            self._append(line)
            self._count(row)
        return row

    def totals(self, grant: str | None = None) -> Totals:
        """The whole file's totals, or one grant id's (a budget's)."""
        with self._lock:
            return self._totals if grant is None else self._by_grant.get(grant, Totals())

    def hold(self, tokens: int, usd: float, grant: str | None = None) -> None:
        """Count (negative: release) what a request of `grant` in flight may spend."""
        with self._lock:
            tokens0, usd0 = self._held.get(grant, (0, 0.0))
            self._held[grant] = (tokens0 + tokens, usd0 + usd)

    def held(self, grant: str | None = None) -> tuple[int, float]:
        with self._lock:
            return self._held.get(grant, (0, 0.0))

    def reserve(self, grant: str | None, decide: Callable[[Totals, int, float], tuple[int, float, T]]) -> T:
        """Check and hold in one step, so that requests checked at once cannot all pass on the same
        remainder: `decide(spent, held_tokens, held_usd)` gives the tokens and dollars to hold (or raises,
        and nothing is held) and a result handed back."""
        with self._lock:
            tokens0, usd0 = self._held.get(grant, (0, 0.0))
            tokens, usd, result = decide(self._by_grant.get(grant, Totals()), tokens0, usd0)
            self._held[grant] = (tokens0 + tokens, usd0 + usd)
        return result

    def rows(self) -> list[dict[str, Any]]:
        """Every readable row of the file, oldest first."""
        out = []
        for line in self.path.read_bytes().splitlines():
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(row, dict):
                out.append(row)
        return out


def summarise(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals of usage rows: overall, by role, by phase and by model (a request refused before it named
    a granted model counts under the role and model `-`)."""
    total = Totals()
    groups: dict[str, dict[str, Totals]] = {"roles": {}, "phases": {}, "models": {}}
    for row in rows:
        total = total.add(row)
        for key, field in (("roles", "role"), ("phases", "phase"), ("models", "model")):
            name = str(row.get(field) or "-")
            groups[key][name] = groups[key].get(name, Totals()).add(row)
    return {"total": total.as_dict(), **{key: {name: t.as_dict() for name, t in sorted(found.items())}
                                         for key, found in groups.items()}}
