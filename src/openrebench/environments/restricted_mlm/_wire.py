"""Large byte payloads (a recorded graph with its constants, rows of logits) over the JSON channel."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

from openrebench.api import SolutionError

CHUNK = 6 * 1024 * 1024  # raw bytes per message: 8 MiB of base64, well under the channel's 16 MiB limit


def send_blob(send: Callable[[dict[str, Any]], None], header: dict[str, Any], data: bytes) -> None:
    chunks = math.ceil(len(data) / CHUNK)
    send({**header, "bytes": len(data), "chunks": chunks})
    view = memoryview(data)
    for i in range(chunks):
        send({"chunk": base64.b64encode(view[i * CHUNK:(i + 1) * CHUNK]).decode()})


def receive_blob(receive: Callable[[], dict[str, Any]], limit: int) -> tuple[dict[str, Any], bytes]:
    """The header and the bytes that follow it; raises SolutionError if they are malformed or over `limit`."""
    header = receive()
    size, chunks = header.get("bytes"), header.get("chunks")
    if not isinstance(size, int) or not isinstance(chunks, int) or not 0 <= size <= limit \
            or chunks != math.ceil(size / CHUNK):
        raise SolutionError(f"the solution process sent a malformed or oversized payload ({size!r} bytes)")
    data = bytearray()
    for _ in range(chunks):
        try:
            data += base64.b64decode(receive().get("chunk", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise SolutionError("the solution process sent a malformed chunk") from None
        if len(data) > size:
            break
    if len(data) != size:
        raise SolutionError("the solution process sent a payload of the wrong size")
    return header, bytes(data)
