"""`gateway-forward SOCKET PORT`: the gateway on 127.0.0.1:PORT inside a sandbox that has no network.

The sandbox sees the gateway's Unix socket; most clients speak only TCP. This relays each TCP
connection byte for byte to the socket, so an unmodified client works with
`OPENAI_BASE_URL=http://127.0.0.1:PORT/v1`. It knows nothing of HTTP (the gateway does the checking);
only when the socket cannot be reached does it answer for the gateway, with a 503 in OpenAI's words.

`gateway-forward --exec SOCKET PORT COMMAND...` runs COMMAND with the relay already listening and
OPENAI_BASE_URL pointing at it. Each command of the agent is a sandbox of its own, with a network
namespace of its own, so the relay must start and end with each command: the port is bound before
COMMAND starts (a client in it never finds it closed), the relay is a forked child that the kernel
kills when COMMAND ends (PR_SET_PDEATHSIG), and COMMAND replaces this process (its pid, signals and
exit status are its own). A COMMAND that waits for every child it has (`wait()` with no pid, until
none is left) would wait for the relay too; shells and Python's subprocess wait by pid.

Standard library only, and no syntax newer than Python 3.8: it runs with the sandbox's Python and sees
none of the package (`install_forwarder` copies this file into the sandbox's bin folder). With PORT 0
it picks a free port; either way it prints `listening on 127.0.0.1:PORT` once it accepts connections
(not in `--exec` mode, whose output is COMMAND's). asyncio is imported only where the relay runs: its
import takes 60-120 ms, which `--exec` would otherwise add to every command.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from pathlib import Path

NAME = "gateway-forward"
CHUNK = 1 << 16
BASE_URL_ENV = "OPENAI_BASE_URL"
PR_SET_PDEATHSIG = 1


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
    import asyncio

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


async def serve(socket_path: str, port: int, host: str = "127.0.0.1",
                listener: socket.socket | None = None) -> None:
    """Relay connections to 127.0.0.1:PORT (or to the bound `listener`) until cancelled."""
    import asyncio

    def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> Any:
        return _relay(socket_path, r, w)

    if listener is not None:
        server = await asyncio.start_server(handle, sock=listener, limit=CHUNK)
    else:
        server = await asyncio.start_server(handle, host, port, limit=CHUNK)
        print(f"listening on {host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this process when its parent (COMMAND) ends; end now if it already has."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):  # not Linux: a sandbox's PID namespace ends it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def exec_with_relay(socket_path: str, port: int, command: list[str]) -> None:
    """Listen on 127.0.0.1:PORT, fork the relay (which dies with this process), then become COMMAND
    with OPENAI_BASE_URL set to the port. Never returns."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        bound = listener.getsockname()[1]
    except OSError as e:
        sys.stderr.write(f"{NAME}: cannot listen on 127.0.0.1:{port} ({e.strerror or e})\n")
        sys.stderr.flush()
        os._exit(126)
    parent = os.getpid()
    if os.fork() == 0:
        try:
            _die_with_parent(parent)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # COMMAND's output is its own: ends when COMMAND's does
                os.dup2(null, fd)
            import asyncio

            asyncio.run(serve(socket_path, 0, listener=listener))
        finally:
            os._exit(0)
    listener.close()  # the relay holds it; COMMAND must not
    os.environ[BASE_URL_ENV] = f"http://127.0.0.1:{bound}/v1"
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.stderr.write(f"{NAME}: cannot run {command[0]}: {e.strerror or e}\n")
        sys.stderr.flush()
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--exec"]:
        if len(args) < 4 or not args[2].isdigit():
            sys.exit(f"usage: {NAME} --exec SOCKET PORT COMMAND [ARG...]")
        exec_with_relay(args[1], int(args[2]), args[3:])
    if len(args) != 2 or not args[1].isdigit():
        sys.exit(f"usage: {NAME} SOCKET PORT   or   {NAME} --exec SOCKET PORT COMMAND [ARG...]")
    import asyncio

    try:
        asyncio.run(serve(args[0], int(args[1])))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        sys.exit(f"{NAME}: cannot listen on 127.0.0.1:{args[1]} ({e.strerror or e})")


# The harness's side: these run outside the sandbox (they are harmless in the installed copy).

def install_forwarder(bin_dir: Path) -> Path:
    """Copy the forwarder into the sandbox's bin folder as an executable `gateway-forward`."""
    from pathlib import Path

    script = Path(bin_dir) / NAME
    script.write_text(f"#!/usr/bin/env python3\n{Path(__file__).read_text()}")
    script.chmod(0o755)
    return script


def forwarder_command(socket_path: Path | str, port: int) -> list[str]:
    """The command that starts the forwarder in the sandbox (its bin folder on PATH)."""
    return [NAME, str(socket_path), str(port)]


def exec_prefix(socket_path: Path | str, port: int, forwarder: Path | str | None = None,
                python: str | None = None) -> list[str]:
    """What to put before a command so that it runs with the gateway on 127.0.0.1:`port` (0: a free
    one) and OPENAI_BASE_URL set: `forwarder` (default: this file) run by `python` (default: this
    interpreter) with -I -S, which start it in about 15 ms instead of 40."""
    script = str(forwarder) if forwarder is not None else os.path.abspath(__file__)
    return [python or sys.executable, "-I", "-S", script, "--exec", str(socket_path), str(port)]


if __name__ == "__main__":
    main()
