"""`gateway-forward SOCKET PORT`: the gateway on 127.0.0.1:PORT inside a sandbox that has no network.

The sandbox sees the gateway's Unix socket; most clients speak only TCP. This relays each TCP
connection byte for byte to the socket, so an unmodified client works with
`OPENAI_BASE_URL=http://127.0.0.1:PORT/v1`. It knows nothing of HTTP (the gateway does the checking);
only when the socket cannot be reached does it answer for the gateway, with a 503 in OpenAI's words.

Standard library only, and no syntax newer than Python 3.8: it runs with the sandbox's Python and sees
none of the package (`install_forwarder` copies this file into the sandbox's bin folder). With PORT 0
it picks a free port; either way it prints `listening on 127.0.0.1:PORT` once it accepts connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

NAME = "gateway-forward"
CHUNK = 1 << 16


def _unreachable(error: OSError) -> bytes:
    message = f"the model gateway cannot be reached ({error.strerror or error})"
    body = json.dumps({"error": {"message": message, "type": "backend_unavailable", "param": None,
                                 "code": "gateway_unreachable"}})
    return (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy until end of file, then pass the half-close on; False when either side broke off."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        return True
    except (OSError, RuntimeError):  # a reset, or writing to a transport already closing
        return False


async def _relay(socket_path: str, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.open_unix_connection(socket_path, limit=CHUNK)
    except OSError as e:
        try:
            client_w.write(_unreachable(e))
            await client_w.drain()
        except OSError:
            pass
        client_w.close()
        return
    to_up = asyncio.ensure_future(_pipe(client_r, up_w))
    to_client = asyncio.ensure_future(_pipe(up_r, client_w))
    for done in asyncio.as_completed([to_up, to_client]):
        if not await done:  # one side broke off: nothing more can go through
            to_up.cancel()
            to_client.cancel()
            break
    for w in (up_w, client_w):
        w.close()
    for w in (up_w, client_w):
        with contextlib.suppress(OSError, RuntimeError):
            await w.wait_closed()


async def serve(socket_path: str, port: int, host: str = "127.0.0.1") -> None:
    server = await asyncio.start_server(lambda r, w: _relay(socket_path, r, w), host, port, limit=CHUNK)
    print(f"listening on {host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit(f"usage: {NAME} SOCKET PORT")
    try:
        asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        sys.exit(f"{NAME}: cannot listen on 127.0.0.1:{sys.argv[2]} ({e.strerror or e})")


# The harness's side: these two run outside the sandbox (they are harmless in the installed copy).

def install_forwarder(bin_dir: Path) -> Path:
    """Copy the forwarder into the sandbox's bin folder as an executable `gateway-forward`."""
    script = Path(bin_dir) / NAME
    script.write_text(f"#!/usr/bin/env python3\n{Path(__file__).read_text()}")
    script.chmod(0o755)
    return script


def forwarder_command(socket_path: Path | str, port: int) -> list[str]:
    """The command that starts the forwarder in the sandbox (its bin folder on PATH)."""
    return [NAME, str(socket_path), str(port)]


if __name__ == "__main__":
    main()
