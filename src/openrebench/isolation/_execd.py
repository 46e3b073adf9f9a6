"""The exec server: the one long-lived process of an attempt's sandbox that starts every command in it.

Standard library only: it runs with the sandbox's Python and none of the package. bubblewrap starts it
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
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import termios

MAX_HEADER = 16 << 20  # a request line: argv and environment (ARG_MAX is 2 MiB on most kernels)
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4

_libc = ctypes.CDLL(None, use_errno=True)


class Config:
    """What the harness tells the server at start (argv[1], JSON)."""

    def __init__(self, data: dict) -> None:
        self.fd: int = data["fd"]
        self.uid: int | None = data.get("uid")  # drop commands to this uid (the server is root), or None
        # The cgroup.procs files of the attempt's cgroup, which each command joins.
        self.cgroup_procs: list[str] = data.get("cgroup_procs", [])
        self.userns: bool = bool(data.get("userns"))
        self.cwd: str = data.get("cwd", "/")
        self.ready_fd: int | None = data.get("ready_fd")
        # Long-running helpers of the harness's (the model gateway's relay): started at once, as the agent
        # and in its cgroup like any command, and started again whenever they exit.
        self.services: list[dict] = data.get("services", [])


CONFIG: Config
USERNS_FD: int | None = None


def _check(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _drop(cfg: Config) -> None:
    """In a forked child: join the attempt's cgroup and its user namespace, and become the agent, for good
    (no capabilities, no_new_privs)."""
    for procs in cfg.cgroup_procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    try:  # the server is protected from out-of-memory kills; its commands are not
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("0")
    except OSError:
        pass
    if USERNS_FD is not None:
        _check(_libc.setns(USERNS_FD, CLONE_NEWUSER))  # its owner (root) may; the agent's uid may not
    if cfg.uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg.uid, cfg.uid, cfg.uid)
        os.setresuid(cfg.uid, cfg.uid, cfg.uid)
    if USERNS_FD is not None:
        _drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))


def _make_userns(cfg: Config) -> int | None:
    """The attempt's user namespace, which every command joins: owned by root (the server), so that no
    process of the agent's can join another or act as its owner, and mapping root and the agent's uid to
    themselves (files keep their real owners inside). A child makes it and sends its descriptor back;
    the server, still in the parent namespace with CAP_SETUID, writes the maps; the descriptor keeps the
    namespace alive after the child exits. None where none can be made."""
    if cfg.uid is None or os.geteuid() != 0:
        return None
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            parent.close()
            _check(_libc.unshare(CLONE_NEWUSER))
            socket.send_fds(child, [b"1"], [os.open("/proc/self/ns/user", os.O_RDONLY)])
            child.recv(1)  # wait until the maps are written
        except BaseException as e:
            sys.stderr.write(f"exec server: no user namespace for the commands ({e})\n")
        os._exit(0)
    child.close()
    fd = None
    try:
        _, fds, _, _ = socket.recv_fds(parent, 16, 1)
        if fds:
            for name, text in (("uid_map", f"0 0 1\n{cfg.uid} {cfg.uid} 1\n"),
                               ("gid_map", f"0 0 1\n{cfg.uid} {cfg.uid} 1\n")):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(text)
            fd = fds[0]
            os.set_inheritable(fd, False)
    except OSError as e:
        sys.stderr.write(f"exec server: no user namespace for the commands ({e})\n")
        fd = None
    finally:
        with contextlib.suppress(OSError):
            parent.send(b"1")
        parent.close()
        os.waitpid(pid, 0)
    return fd


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)))


def _child_error(w: int, e: BaseException) -> None:
    """Report why the child could not exec (on a close-on-exec pipe) and die."""
    try:
        os.write(w, json.dumps(_error(e)).encode())
    finally:
        os._exit(127)


def _spawn(argv: list[str], cwd: str, env: dict[str, str], fds: tuple[int, int, int],
           tty: bool = False) -> tuple[int, dict | None]:
    """Fork and exec `argv` in a session of its own; returns its pid, or an error dict if exec failed."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            _drop(CONFIG)
            for target, fd in enumerate(fds):
                os.dup2(fd, target, inheritable=True)
            if tty:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            os.chdir(cwd)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:
            _child_error(w, e)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    if data:
        os.waitpid(pid, 0)
        try:
            return pid, json.loads(data)
        except ValueError:
            return pid, {"error": "OSError", "errno": 0, "message": data.decode(errors="replace")}
    return pid, None


def _session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies are dead already: their reaper is the sandbox's init)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # state ppid pgrp session
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _is_frozen() -> bool:
    """Whether the harness has frozen the attempt (a scoring runs): then nothing here may thaw it."""
    for procs in CONFIG.cgroup_procs:
        folder = os.path.dirname(procs)
        for name, frozen in (("freezer.state", "FROZEN"), ("cgroup.freeze", "1")):
            with contextlib.suppress(OSError), open(os.path.join(folder, name)) as f:
                if f.read().strip() == frozen:
                    return True
    return False


def _set_frozen(frozen: bool) -> bool:
    """Freeze or thaw the attempt's cgroup (all its commands), where it has a freezer; False where not."""
    for procs in CONFIG.cgroup_procs:
        folder = os.path.dirname(procs)
        for name, value in (("cgroup.freeze", "1" if frozen else "0"),
                            ("freezer.state", "FROZEN" if frozen else "THAWED")):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                try:
                    with open(path, "w") as f:
                        f.write(value)
                    return True
                except OSError:
                    return False
    return False


def _kill_session(sid: int) -> None:
    """Kill every process of the session, however fast it forks: the commands are frozen while the list is
    read and the kills sent (a thawed fork bomb would outrun any loop), then thawed so the kills land."""
    import time

    if _is_frozen():  # a scoring runs: the kills land when the harness thaws the attempt
        for pid in _session_members(sid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frozen = _set_frozen(True)
        if frozen:  # wait until the freeze holds (v1 reports FREEZING on its way)
            time.sleep(0.01)
        members = _session_members(sid)
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if frozen:
            _set_frozen(False)
        if not members:
            return
        time.sleep(0.01)


async def _wait_exit(pid: int) -> int:
    """Wait for the child without blocking the loop (a pidfd becomes readable when it exits)."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    if pidfd is not None:
        done = loop.create_future()
        loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
        try:
            await done
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
    else:
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                break
            await asyncio.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as shells report it


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


def _error(e: BaseException) -> dict:
    message = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return {"ok": False, "error": type(e).__name__, "errno": getattr(e, "errno", None) or 0,
            "message": message}


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
            pid, failure = _spawn(req["argv"], req.get("cwd") or CONFIG.cwd, req.get("env") or {},
                                  (fd_in, out, err))
        finally:
            if fd_in != stdin:
                os.close(fd_in)
        if failure is not None:
            await _reply(writer, {"ok": False, **failure})
            return
        exited = asyncio.ensure_future(_wait_exit(pid))
        gone = asyncio.ensure_future(reader.read(1))  # the client gives up (b"k", or by closing): kill
        await asyncio.wait([exited, gone], return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            _kill_session(pid)
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
            _drop(CONFIG)
            os.chdir(CONFIG.cwd)
            if make_parents and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, flags | os.O_CLOEXEC, mode)
            if flags & (os.O_WRONLY | os.O_RDWR) == 0 and os.path.isdir(f"/proc/self/fd/{fd}"):
                raise IsADirectoryError(errno.EISDIR, f"{path} is a directory", path)
            socket.send_fds(child, [b"{}"], [fd])
            os._exit(0)
        except BaseException as e:
            try:
                child.sendall(json.dumps(_error(e)).encode())
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
        pid, failure = _spawn(req["argv"], req.get("cwd") or CONFIG.cwd, req.get("env") or {}, child_fds,
                              tty=pty)
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
    exited = asyncio.ensure_future(_wait_exit(pid))
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
            await _reply(writer, {"ok": True, "pid": os.getpid(), "userns": USERNS_FD is not None})
        else:
            await _reply(writer, {"ok": False, "error": "ValueError", "errno": 0,
                                  "message": f"unknown op {op!r}"})
    except (ConnectionError, EOFError, asyncio.IncompleteReadError):
        pass
    except Exception as e:  # never let one request take the server down
        with contextlib.suppress(Exception):
            await _reply(writer, _error(e))
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _keep_running(service: dict) -> None:
    """Run a service for the sandbox's lifetime: again a second after each exit (the agent may end it)."""
    while True:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid, failure = _spawn(service["argv"], service.get("cwd") or CONFIG.cwd, service.get("env") or {},
                                  (null, null, null))
        finally:
            os.close(null)
        if failure is None:
            await _wait_exit(pid)
        await asyncio.sleep(1.0)


async def _serve(cfg: Config) -> None:
    sock = socket.socket(fileno=cfg.fd)
    sock.setblocking(False)
    server = await asyncio.start_unix_server(_handle, sock=sock, limit=MAX_HEADER)
    if cfg.ready_fd is not None:
        ready = {"pid": os.getpid(), "userns": USERNS_FD is not None}
        os.write(cfg.ready_fd, json.dumps(ready).encode() + b"\n")
        os.close(cfg.ready_fd)
    services = [asyncio.ensure_future(_keep_running(service)) for service in cfg.services]
    async with server:
        await server.serve_forever()
    for task in services:
        task.cancel()


def main() -> None:
    global CONFIG, USERNS_FD
    CONFIG = Config(json.loads(sys.argv[1]))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if CONFIG.userns:
        USERNS_FD = _make_userns(CONFIG)
    asyncio.run(_serve(CONFIG))


if __name__ == "__main__":
    main()
