"""A streamed answer on its way out: the backend's chunks written to the client as they come, and the
call's row settled however the stream ends (the client gone, the backend failing mid-stream, a timeout).
The events themselves are `_streaming`'s; this is the HTTP side, apart from the serving of whole answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from ._backends import BackendError, ModelBackend
from ._limits import Refusal
from ._metering import Call, Metering
from ._streaming import Relay, StreamMeter, whole_as_chunks
from ._upstream import BackendCalls

logger = logging.getLogger(__name__)

STREAM_WRITE_TIMEOUT_S = 30.0  # a streaming client this long without taking in an event is dropped


class StreamAnswers(BackendCalls, Metering):
    """Streamed answers: a mixin of `Gateway`, which sets `request_timeout_s`."""

    request_timeout_s: float

    async def _stream(self, request: web.Request, endpoint: str, kind: str, call: Call,
                      body: dict[str, Any], relay: Relay, t0: float, timer: asyncio.Timeout
                      ) -> web.StreamResponse:
        """A streamed answer: the backend's chunks passed on as they come (its whole answer at once, where
        it does not stream), metered when the stream ends. Until the first chunk a failure is an HTTP
        error as for a whole answer; after it, an event of the stream, and the row is written here."""
        assert call.grant is not None and call.model is not None
        backend = call.model.backend
        meter = StreamMeter(bool(getattr(backend, "usage_counts_one_choice", False)))
        async with self._queue(backend).slot(call.grant.run_id):
            chunks = _chunks(backend, kind, body)
            try:
                first = await self._from_backend(call, anext(chunks, None))
                return await self._relay(request, endpoint, call, chunks, first, relay, meter, t0, timer)
            finally:
                await chunks.aclose()  # a stream left early: its upstream connection is dropped

    async def _relay(self, request: web.Request, endpoint: str, call: Call,
                     chunks: AsyncGenerator[dict[str, Any], None], first: dict[str, Any] | None, relay: Relay,
                     meter: StreamMeter, t0: float, timer: asyncio.Timeout) -> web.StreamResponse:
        """Write the stream; settle its row however it ends. A client that leaves mid-stream, or a backend
        that fails in it, is charged the prompt and what was streamed (its bytes bound its tokens; the
        upstream is closed at once, so little more is written); a timeout or the gateway closing, what
        the call held, as for a whole answer."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        failure: Refusal | None = None
        try:
            await _prepare(response, request)
            call.response = response
            await _write(response, relay.start())
            chunk = first
            while chunk is not None:
                meter.add(chunk)
                await _write(response, relay.chunk(chunk))
                chunk = await anext(chunks, None)
        except _ClientGone:
            await chunks.aclose()
            self._settle_partial(call, endpoint, t0, meter, 499, "the client left mid-stream: charged the "
                                 "prompt and what was streamed (its bytes bound its tokens)")
            call.response = response
            return response
        except BackendError as e:
            failure = Refusal(e.status, e.message, e.type, e.type)
        except asyncio.CancelledError:
            failure = (Refusal(504, f"the model call took longer than {self.request_timeout_s:g} s",
                               "timeout", "timeout") if timer.expired() else
                       Refusal(499, "cancelled (the gateway closed): charged what the call held",
                               "server_error", "cancelled"))
            prompt, completion = call.prompt_bound, call.completion_held if call.capped else meter.streamed
            self._record(call.grant, call.role, call.model, endpoint, t0, status=failure.status,
                         prompt=prompt, completion=completion, error=failure.message)
            call.recorded = True
            with contextlib.suppress(_ClientGone):  # a last word, if the client takes it at once
                await _write(response, relay.fail(failure.message, failure.type, failure.code), timeout_s=1.0)
            raise
        except Exception as e:
            failure = self._broken(call, e, " mid-stream")
        else:
            prompt, completion = self._settle(call, endpoint, t0, meter.reported(), meter.streamed)
            try:
                await _write(response, relay.finish(prompt, completion, meter.upstream_usage()), eof=True)
            except _ClientGone:
                pass
            except Exception:  # its row is written: a bug here must not answer a second time
                logger.exception("the gateway failed to end a stream of %s", call.model.model_name)
            return response
        self._settle_partial(call, endpoint, t0, meter, failure.status, failure.message)
        with contextlib.suppress(_ClientGone):
            await _write(response, relay.fail(failure.message, failure.type, failure.code), eof=True,
                         timeout_s=1.0)
        return response


async def _chunks(backend: ModelBackend, kind: str, body: dict[str, Any]
                  ) -> AsyncGenerator[dict[str, Any], None]:
    """The chunks of an answer: the backend's own stream where it has one, else its whole answer as
    chunks, once it is written."""
    stream = getattr(backend, "stream", None)
    if stream is not None:
        async for chunk in stream(kind, body):
            yield chunk
        return
    output = await (backend.chat if kind == "chat" else backend.complete)(body)
    if not isinstance(output, dict):
        raise BackendError(f"the backend of {getattr(backend, 'name', 'the model')} gave no response object")
    for chunk in whole_as_chunks(output, kind):
        yield chunk


class _ClientGone(Exception):
    """The client closed its connection while its stream was being written."""


async def _prepare(response: web.StreamResponse, request: web.Request) -> None:
    try:
        await response.prepare(request)
    except ConnectionError:
        raise _ClientGone from None


async def _write(response: web.StreamResponse, data: bytes, eof: bool = False,
                 timeout_s: float | None = None) -> None:
    """Send `data` now (a stream's events are not held back), and end the body if `eof`. A client that
    takes more than `STREAM_WRITE_TIMEOUT_S` to take it in is gone: a stream holds one of the backend's
    places, which a client that stops reading must not keep from other runs for the whole time limit."""
    try:
        async with asyncio.timeout(timeout_s or STREAM_WRITE_TIMEOUT_S):
            if data:
                await response.write(data)
            if eof:
                await response.write_eof()
    except (ConnectionError, TimeoutError):
        raise _ClientGone from None
