"""The exec server: the one long-lived process of an attempt's sandbox that starts every command in it.

Standard library only: it runs with the sandbox's Python and none of the package (its processes are
`_execd_proc.py`, beside it, loaded by its path). bubblewrap starts it
(as PID 2, under bubblewrap's reaping init) with a listening Unix socket inherited as a file descriptor:
the socket has no path inside the sandbox, so nothing the agent runs can reach it. The harness connects
from outside for every command, file read or write, and terminal.

Each command is forked from here, so it inherits what bubblewrap set up once (namespaces, the seccomp
filter, no_new_privs); the child then joins the attempt's cgroup, drops to the agent's uid (where the
server is root) and into the attempt's user namespace, and execs. The reply comes when the command's
main process exits, not when its output pipes close: stdout and stderr are memory files (memfd), so a
job left in the background (`nohup train.py &`) keeps writing to them, or to its own files, without
blocking the reply or dying of SIGPIPE. A client that goes away before the reply (a timeout, a cancelled
tool call) has the command's whole session killed.

Wire format: a request is one JSON line, then the bytes it announces; a reply is one JSON line, then the
bytes it announces. Errors come back as {"ok": false, "error": <Python exception name>, "errno": n}.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import signal
import socket
import struct
import sys
import termios
from types import ModuleType

MAX_HEADER = 16 << 20  # a request line: argv and environment (ARG_MAX is 2 MiB on most kernels)
PR_SET_DUMPABLE = 4


def _beside(name: str) -> ModuleType:
    """The module `name`.py beside this file: with -I the script's folder is not on sys.path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


proc = _beside("_execd_proc")


def _tail(fd: int, limit: int) -> tuple[bytes, bool]:
    size = os.fstat(fd).st_size
    start = max(0, size - limit)
    chunks = []
    offset = start
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks), start > 0


async def _reply(writer: asyncio.StreamWriter, header: dict, *payloads: bytes) -> None:
    writer.write(json.dumps(header).encode() + b"\n")
    for p in payloads:
        writer.write(p)
    await writer.drain()


async def _read_into(reader: asyncio.StreamReader, fd: int, size: int) -> None:
    left = size
    while left:
        chunk = await reader.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
        left -= len(chunk)


async def _exec(req: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
    out = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err = os.memfd_create("stderr", os.MFD_CLOEXEC)
    try:
        if req.get("stdin") is not None:
            await _read_into(reader, stdin, int(req["stdin"]))
            os.lseek(stdin, 0, os.SEEK_SET)
            fd_in = stdin
        else:
            fd_in = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid, failure = proc._spawn(req["argv"], req.get("cwd") or proc.CONFIG.cwd, req.get("env") or {},
                                  (fd_in, out, err))
        finally:
            if fd_in != stdin:
                os.close(fd_in)
        if failure is not None:
            await _reply(writer, {"ok": False, **failure})
            return
        exited = asyncio.ensure_future(proc._wait_exit(pid))
        gone = asyncio.ensure_future(reader.read(1))  # the client gives up (b"k", or by closing): kill
        await asyncio.wait([exited, gone], return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            proc._kill_session(pid)
            await exited
            await _reply(writer, {"ok": False, "error": "TimeoutError", "errno": 0, "killed": True,
                                  "message": "the command was killed"})
            return
        gone.cancel()
        limit = int(req.get("limit") or (10 << 20))
        stdout, cut_out = _tail(out, limit)
        stderr, cut_err = _tail(err, limit)
        await _reply(writer, {"ok": True, "rc": exited.result(), "stdout": len(stdout), "stderr": len(stderr),
                              "truncated": cut_out or cut_err}, stdout, stderr)
    finally:
        for fd in (stdin, out, err):
            os.close(fd)


def _open_as_agent(path: str, flags: int, mode: int = 0o644,
                   make_parents: bool = False) -> tuple[int | None, dict | None]:
    """Open `path` in a child that has become the agent (so the agent's permissions decide, and a link
    the agent planted leads only where the agent could go), and receive the descriptor from it."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            parent.close()
            proc._drop(proc.CONFIG)
            os.chdir(proc.CONFIG.cwd)
            if make_parents and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, flags | os.O_CLOEXEC, mode)
            if flags & (os.O_WRONLY | os.O_RDWR) == 0 and os.path.isdir(f"/proc/self/fd/{fd}"):
                raise IsADirectoryError(errno.EISDIR, f"{path} is a directory", path)
            socket.send_fds(child, [b"{}"], [fd])
            os._exit(0)
        except BaseException as e:
            try:
                child.sendall(json.dumps(proc._error(e)).encode())
            finally:
                os._exit(1)
    child.close()
    try:
        msg, fds, _, _ = socket.recv_fds(parent, 1 << 16, 1)
    finally:
        parent.close()
        os.waitpid(pid, 0)
    if fds:
        return fds[0], None
    try:
        return None, json.loads(msg or b"{}") or {"ok": False, "error": "OSError", "errno": 0,
                                                  "message": "the file could not be opened"}
    except ValueError:
        return None, {"ok": False, "error": "OSError", "errno": 0, "message": msg.decode(errors="replace")}


async def _read(req: dict, writer: asyncio.StreamWriter) -> None:
    fd, failure = _open_as_agent(req["path"], os.O_RDONLY | os.O_NONBLOCK)
    if fd is None:
        await _reply(writer, failure or {})
        return
    try:
        limit = int(req.get("limit") or (100 << 20))
        size = os.fstat(fd).st_size
        if size > limit:
            await _reply(writer, {"ok": False, "error": "OutputLimitExceeded", "errno": 0, "size": size,
                                  "message": f"{req['path']} is {size} bytes"})
            return
        os.set_blocking(fd, True)
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, 1 << 20)):
            data += chunk
        if len(data) > limit:
            await _reply(writer, {"ok": False, "error": "OutputLimitExceeded", "errno": 0, "size": len(data),
                                  "message": f"{req['path']} is over {limit} bytes"})
            return
        await _reply(writer, {"ok": True, "size": len(data)}, data)
    finally:
        os.close(fd)


async def _write(req: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    size = int(req["size"])
    fd, failure = _open_as_agent(req["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, make_parents=True)
    if fd is None:
        await reader.readexactly(size)  # keep the stream in step; the reply says why
        await _reply(writer, failure or {})
        return
    try:
        await _read_into(reader, fd, size)
    finally:
        os.close(fd)
    await _reply(writer, {"ok": True})


async def _tty(req: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A terminal: the shell on a pty of the sandbox, relayed to the client (with "pty": false, on pipes,
    for a client whose input is not a terminal: `docker exec -i` to the pty's `-it`). Client frames:
    b"d" + length + bytes typed, b"r" + length + rows, cols (resize), b"e" (input ended). When the
    client goes, the terminal hangs up (its session gets SIGHUP, as after a dropped ssh connection);
    what runs in tmux or under nohup goes on."""
    pty = bool(req.get("pty", True))
    if pty:
        master, slave = os.openpty()
        os.set_inheritable(master, False)
        size = struct.pack("HHHH", req.get("rows", 24), req.get("cols", 80), 0, 0)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        source, sink, child_fds = master, master, (slave, slave, slave)
    else:
        in_r, sink = os.pipe2(os.O_CLOEXEC)
        source, out_w = os.pipe2(os.O_CLOEXEC)
        child_fds = (in_r, out_w, out_w)
    try:
        pid, failure = proc._spawn(req["argv"], req.get("cwd") or proc.CONFIG.cwd, req.get("env") or {},
                                   child_fds, tty=pty)
    finally:
        for fd in set(child_fds):
            os.close(fd)
    if failure is not None:
        for fd in {source, sink}:
            os.close(fd)
        await _reply(writer, {"ok": False, **failure})
        return
    await _reply(writer, {"ok": True, "pid": pid})
    loop = asyncio.get_running_loop()
    out_closed = loop.create_future()

    def on_output() -> None:
        try:
            data = os.read(source, 65536)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(source)
            if not out_closed.done():
                out_closed.set_result(None)
            return
        writer.write(data)

    loop.add_reader(source, on_output)
    open_fds = {source, sink}

    def close(fd: int) -> None:
        if fd in open_fds:
            open_fds.discard(fd)
            os.close(fd)

    async def pump_input() -> None:
        while True:
            head = await reader.readexactly(5)
            kind, size = head[:1], struct.unpack(">I", head[1:])[0]
            body = await reader.readexactly(size)
            if kind == b"d" and sink in open_fds:
                view = memoryview(body)
                while view:
                    view = view[os.write(sink, view):]
            elif kind == b"r" and size == 4 and pty:
                rows, cols = struct.unpack(">HH", body)
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            elif kind == b"e" and not pty:
                close(sink)  # the shell reads to the end of its input

    typing = asyncio.ensure_future(pump_input())
    exited = asyncio.ensure_future(proc._wait_exit(pid))
    await asyncio.wait([typing, out_closed], return_when=asyncio.FIRST_COMPLETED)
    if not out_closed.done():  # the client went: hang the terminal up (SIGHUP to its session)
        loop.remove_reader(source)
        for fd in list(open_fds):
            close(fd)
        if not pty:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGHUP)
    typing.cancel()
    await asyncio.wait([exited], timeout=30)
    for fd in list(open_fds):
        close(fd)
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        line = await reader.readline()
        if not line:
            return
        req = json.loads(line)
        op = req.get("op")
        if op == "exec":
            await _exec(req, reader, writer)
        elif op == "read":
            await _read(req, writer)
        elif op == "write":
            await _write(req, reader, writer)
        elif op == "tty":
            await _tty(req, reader, writer)
        elif op == "ping":
            await _reply(writer, {"ok": True, "pid": os.getpid(), "userns": proc.USERNS_FD is not None})
        else:
            await _reply(writer, {"ok": False, "error": "ValueError", "errno": 0,
                                  "message": f"unknown op {op!r}"})
    except (ConnectionError, EOFError, asyncio.IncompleteReadError):
        pass
    except Exception as e:  # never let one request take the server down
        with contextlib.suppress(Exception):
            await _reply(writer, proc._error(e))
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _keep_running(service: dict) -> None:
    """Run a service for the sandbox's lifetime: again a second after each exit (the agent may end it)."""
    while True:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid, failure = proc._spawn(service["argv"], service.get("cwd") or proc.CONFIG.cwd,
                                       service.get("env") or {}, (null, null, null))
        finally:
            os.close(null)
        if failure is None:
            await proc._wait_exit(pid)
        await asyncio.sleep(1.0)


async def _serve(cfg: proc.Config) -> None:
    sock = socket.socket(fileno=cfg.fd)
    sock.setblocking(False)
    server = await asyncio.start_unix_server(_handle, sock=sock, limit=MAX_HEADER)
    if cfg.ready_fd is not None:
        ready = {"pid": os.getpid(), "userns": proc.USERNS_FD is not None}
        os.write(cfg.ready_fd, json.dumps(ready).encode() + b"\n")
        os.close(cfg.ready_fd)
    services = [asyncio.ensure_future(_keep_running(service)) for service in cfg.services]
    async with server:
        await server.serve_forever()
    for task in services:
        task.cancel()


def main() -> None:
    proc.CONFIG = proc.Config(json.loads(sys.argv[1]))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    proc._libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if proc.CONFIG.userns:
        proc.USERNS_FD = proc._make_userns(proc.CONFIG)
    asyncio.run(_serve(proc.CONFIG))


if __name__ == "__main__":
    main()
