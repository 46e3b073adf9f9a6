"""A run's access to the gateway: the models its roles name, its budget, and the check that holds a
request's worst case against that budget, kept apart from the HTTP server that looks grants up."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._backends import ModelBackend
from ._limits import limit
from ._usage import Totals, UsageLog, cost_usd

MAX_PENDING = 128  # requests of one grant in flight or waiting for a slot: more are refused at once (each
# holds a connection, hence a file descriptor of the harness, until it ends)


@dataclass(frozen=True)
class RoleModel:
    """The model behind a role: its backend, the name clients see (and the price is looked up by), and
    optionally its price in US$ per million input/output tokens (else the price table's)."""

    backend: ModelBackend
    model_name: str
    price: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Budget:
    """What a run may spend: dollars, tokens (input plus output), either or both; None is no limit.
    `reply_tokens`: the most completion tokens of one choice (a request's `max_tokens` is cut to it)."""

    usd: float | None = None
    tokens: int | None = None
    reply_tokens: int | None = None


@dataclass
class Grant:
    """A run's access: its roles, budget and usage log, reached with its bearer token."""

    token: str = field(repr=False)
    run_id: str
    roles: dict[str, RoleModel]
    budget: Budget
    usage: UsageLog
    prices: dict[str, Mapping[str, float] | None]
    concurrency: int
    phase: str | None = None  # when the run uses it (`agent`, `scoring`), recorded in each row
    max_pending: int = MAX_PENDING
    socket_path: Path | None = None  # the grant's own socket, if it has one (see `Gateway.grant`)
    max_connections: int = MAX_PENDING
    slots: asyncio.Semaphore = field(init=False, repr=False)
    pending: int = field(init=False, default=0, repr=False)
    connections: int = field(init=False, default=0, repr=False)

    @property
    def socket_dir(self) -> Path | None:
        """The folder of the grant's own socket: what a sandbox binds (a folder, so that the socket of a
        restarted gateway shows through the bind)."""
        return None if self.socket_path is None else self.socket_path.parent

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.concurrency)

    def totals(self) -> Totals:
        """What this grant's budget has spent: the rows of its id (a grant again for the same id, after
        a restart, goes on counting them)."""
        return self.usage.totals(self.run_id)

    def room(self, price: Mapping[str, float] | None, prompt: int, spent: Totals, held: tuple[int, float]
             ) -> tuple[int | None, str]:
        """Completion tokens the budget has room for once `prompt` tokens are taken off, after what is
        `spent` and what the requests in flight hold (None: no limit; negative: the prompt alone does not
        fit), and the budget that binds, in words."""
        room: int | None = None
        what = "token budget"
        if self.budget.tokens is not None:
            room = self.budget.tokens - spent.tokens - held[0] - prompt
        if self.budget.usd is not None and price:
            # A hair under what is left, so that summing the rows' float costs stays within the budget.
            left = (self.budget.usd - spent.cost_usd - held[1]) * (1 - 1e-9) - cost_usd(price, prompt, 0)
            out = price.get("output", 0.0)
            dollars = math.floor(left / out * 1e6) if out > 0 else None if left >= 0 else -1
            if dollars is not None and (room is None or dollars < room):
                room, what = dollars, "dollar budget"
        return room, what

    def reserve(self, role: str, prompt: int, body: dict[str, Any]) -> tuple[int, float, bool]:
        """Hold the request's worst case against the budget, atomically with the check: `prompt` (a bound,
        see `prompt_bound`) plus its completion cap times its choices, the cap shrunk (and imposed) to what
        remains; refused (429) when even one token a choice does not fit. Gives the completion tokens
        and the dollars held, and whether a budget capped the request."""
        price, model = self.prices[role], self.roles[role]
        who = "this scoring" if self.phase == "scoring" else "the run"
        most = getattr(model.backend, "max_choices", None)

        def decide(spent: Totals, held_tokens: int, held_usd: float
                   ) -> tuple[int, float, tuple[int, float, bool]]:
            room, what = self.room(price, prompt, spent, (held_tokens, held_usd))
            completion = limit(body, room, prompt, f"{who}'s {what}", max_choices=most,
                               model=model.model_name, reply_cap=self.budget.reply_tokens)
            usd = cost_usd(price, prompt, completion)
            return prompt + completion, usd, (completion, usd, room is not None)

        return self.usage.reserve(self.run_id, decide)

    def resolve(self, name: object) -> tuple[str, RoleModel] | None:
        """The role a request's `model` names: the role itself or its model's name."""
        if not isinstance(name, str):
            return None
        if name in self.roles:
            return name, self.roles[name]
        return next(((r, m) for r, m in self.roles.items() if m.model_name == name), None)

    def exhausted(self) -> str | None:
        """Which budget is spent, in words, or None."""
        t = self.totals()
        who = "this scoring" if self.phase == "scoring" else "the run"
        if self.budget.usd is not None and t.cost_usd >= self.budget.usd:
            return (f"budget exceeded: {who} has spent ${t.cost_usd:.4f} of its ${self.budget.usd:.4f} "
                    "dollar budget")
        if self.budget.tokens is not None and t.tokens >= self.budget.tokens:
            return (f"budget exceeded: {who} has used {t.tokens:,} of its {self.budget.tokens:,} "
                    "token budget")
        return None
