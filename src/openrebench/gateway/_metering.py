"""Metering: what a request holds of its run's budget while in flight, and the usage row that settles
it however it ends (answered, refused, timed out, cancelled), kept apart from the serving so that every
path of a request is charged by the same few functions."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ._backends import ModelBackend
from ._grants import Grant, RoleModel
from ._streaming import StreamMeter
from ._usage import UsageLog

logger = logging.getLogger(__name__)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class Call:
    """One request on its way: whom it is for, and what of the budget it holds while in flight."""

    grant: Grant | None = None
    role: str | None = None
    model: RoleModel | None = None
    prompt_bound: int = 0
    completion_held: int = 0
    capped: bool = False  # a budget capped it: what it holds is all it may spend
    started: bool = False  # the backend has it: a timeout or cancellation may have cost the provider
    response: web.StreamResponse | None = None  # a stream's, once its headers are sent
    recorded: bool = False  # its row is written
    _held: tuple[int, float] | None = None

    def reserve(self, grant: Grant, prompt: int, body: dict[str, Any]) -> None:
        assert self.role is not None
        self.completion_held, usd, self.capped = grant.reserve(self.role, prompt, body)
        self.prompt_bound = prompt
        self._held = (prompt + self.completion_held, usd)
        self.started = True

    def release(self) -> None:
        if self._held is not None and self.grant is not None:
            self.grant.usage.hold(-self._held[0], -self._held[1], self.grant.run_id)
            self._held = None

    def charge(self) -> dict[str, int]:
        """What a call that ended without an answer is charged: nothing, unless the backend had it."""
        if not self.started:
            return {}
        return {"prompt": self.prompt_bound, "completion": self.completion_held}


def reported_usage(output: dict[str, Any], backend: ModelBackend) -> tuple[int | None, int | None]:
    """The prompt and completion tokens a whole answer reports (None: not reported); a backend whose
    usage counts one choice (llama.cpp's) is charged its count once a choice."""
    usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    choices = output.get("choices")
    one_choice = getattr(backend, "usage_counts_one_choice", False)
    if completion is not None and one_choice and isinstance(choices, list):
        completion *= max(1, len(choices))
    return prompt, completion


class Metering:
    """The gateway's usage rows: a mixin of `Gateway`, which sets `_anonymous` (the log of requests that
    no grant owns, or None)."""

    _anonymous: UsageLog | None

    def _settle(self, call: Call, endpoint: str, t0: float, reported: tuple[int | None, int | None],
                bound: int) -> tuple[int, int]:
        """Charge an answered call what its backend reported (never nothing: the gateway's bounds, the
        prompt's and `bound` for the completion, where it reported no usage), record its row, and give
        the tokens charged."""
        model = call.model
        assert model is not None
        prompt, completion = reported
        error = None
        if prompt is None or completion is None:  # never free: the bounds, from the bytes
            error = "the backend reported no usage: charged the gateway's bound"
            if prompt is None:
                prompt = call.prompt_bound
            if completion is None:
                completion = min(bound, call.completion_held) if call.capped else bound
        over = max(prompt - call.prompt_bound, 0) + max(completion - call.completion_held, 0)
        if call.capped and over > 0:  # a backend past its max_tokens, or a prompt past the bound: counted
            error = f"the backend reported {over:,} token(s) more than the gateway reserved"
            logger.warning("%s: %s (prompt %d of %d, completion %d of %d)", model.model_name, error, prompt,
                           call.prompt_bound, completion, call.completion_held)
        self._record(call.grant, call.role, model, endpoint, t0, status=200, prompt=prompt,
                     completion=completion, error=error)
        call.recorded = True
        return prompt, completion

    def _settle_partial(self, call: Call, endpoint: str, t0: float, meter: StreamMeter, status: int,
                        error: str) -> None:
        """Charge a stream that ended early: the prompt (as reported, else its bound) and what was
        streamed (its bytes, within what the call held)."""
        prompt = meter.reported()[0]
        completion = min(meter.streamed, call.completion_held) if call.capped else meter.streamed
        self._record(call.grant, call.role, call.model, endpoint, t0, status=status, error=error,
                     prompt=call.prompt_bound if prompt is None else prompt, completion=completion)
        call.recorded = True

    def _record(self, grant: Grant | None, role: str | None, model: RoleModel | None, endpoint: str,
                t0: float, *, status: int, prompt: int | None = 0, completion: int | None = 0,
                error: str | None = None) -> None:
        log = grant.usage if grant is not None else self._anonymous
        fields = {"grant": None if grant is None else grant.run_id,
                  "phase": None if grant is None else grant.phase, "role": role,
                  "model": None if model is None else model.model_name, "endpoint": endpoint,
                  "status": status, "prompt_tokens": prompt or 0, "completion_tokens": completion or 0,
                  "price": None if grant is None or role is None else grant.prices[role],
                  "latency_s": time.perf_counter() - t0, "error": error}
        if log is None:
            logger.info("gateway request without a grant: %s", fields)
            return
        try:
            log.record(**fields)
        except FileNotFoundError:  # a request that outlived its run (a throw-away calibration run, removed)
            logger.warning("the usage log %s is gone (its run was removed): a request not logged", log.path)
        except OSError:
            logger.exception("the usage log %s cannot be written", log.path)
