"""The exec server's processes: becoming the agent (its cgroup, its user namespace, its uid, no
capabilities), starting a command in a session of its own, and killing or waiting for one. Apart from
the server's wire protocol (`_execd.py`), which loads this file by its path: like the server, it runs
with the sandbox's Python, the standard library only and none of the package. The server sets CONFIG
and USERNS_FD at start."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import sys
import termios

CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38

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


CONFIG: Config = None  # type: ignore[assignment]  # set by the server at its start (_execd.main)
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


def _error(e: BaseException) -> dict:
    message = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return {"ok": False, "error": type(e).__name__, "errno": getattr(e, "errno", None) or 0,
            "message": message}
