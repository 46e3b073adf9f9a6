"""Calls to the backends: each backend's fair queue, its whole answer, and its failures turned into
the client's errors (a backend's own bug logged here and told without its details)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterator
from typing import Any

from ._backends import BackendError, ModelBackend
from ._fair import DEFAULT_CAPACITY, FairQueue
from ._limits import Refusal
from ._metering import Call

logger = logging.getLogger(__name__)


class BackendCalls:
    """How the gateway asks a backend: a mixin of `Gateway`, which sets `_queues` (by backend)."""

    _queues: dict[int, FairQueue]

    def _queue(self, backend: ModelBackend) -> FairQueue:
        """The backend's fair queue, shared by every grant that uses it (`capacity`: its own, if it
        names one, e.g. the llama.cpp server's slots)."""
        queue = self._queues.get(id(backend))
        if queue is None:
            capacity = getattr(backend, "capacity", None) or DEFAULT_CAPACITY
            queue = self._queues[id(backend)] = FairQueue(int(capacity))
        return queue

    async def _whole(self, call: Call, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """The backend's whole answer, its failures as the client's errors."""
        assert call.grant is not None and call.model is not None
        backend = call.model.backend
        async with self._queue(backend).slot(call.grant.run_id):
            ask = backend.chat if kind == "chat" else backend.complete
            output = await self._from_backend(call, ask(body))
        call.started = False
        if not isinstance(output, dict):
            raise Refusal(502, f"the backend of {call.model.model_name} gave no response object",
                          "upstream_error", "upstream_error")
        return output

    async def _from_backend(self, call: Call, answer: Awaitable[Any]) -> Any:
        """The backend's answer (or first chunk), its failures as the client's errors."""
        try:
            return await answer
        except BackendError as e:
            call.started = e.status == 504  # refused upstream, nothing spent, unless it timed out
            raise Refusal(e.status, e.message, e.type, e.type) from None
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as e:
            call.started = False
            raise self._broken(call, e) from None

    @staticmethod
    def _broken(call: Call, e: Exception, when: str = "") -> Refusal:
        """A backend's own bug, logged here and told without its details (they may be the harness's)."""
        name = call.model.model_name if call.model is not None else "?"
        logger.error("the backend of %s failed%s", name, when, exc_info=e)
        return Refusal(502, f"the backend of {name} failed{when} ({type(e).__name__})", "upstream_error",
                       "upstream_error")


@contextlib.contextmanager
def refused_as_400() -> Iterator[None]:
    """A request the gateway or its backend will not serve as asked (a BackendError before any call):
    refused with its status, nothing held or spent."""
    try:
        yield
    except BackendError as e:
        raise Refusal(e.status, e.message, e.type, e.type) from None
