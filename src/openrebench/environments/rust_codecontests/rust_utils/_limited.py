"""Running an untrusted command under limits, for rust_utils: a session of its own killed as a group when
it ends or runs out of time, with whatever it forked and moved out of the group while holding our pipes;
stdout capped, the head of stderr kept, rlimits set in the child. Standard library only (the agent's
workspace gets this package as `rust_codecontests_utils`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

STDERR_KEEP_BYTES = 16 << 10
KILL_GRACE_S = 2.0  # after a kill, how long the pipes may take to close before we stop reading


def _limits_preexec(limits: dict[int, int]) -> Callable[[], None]:
    """A preexec_fn setting these rlimits in the child (soft = hard, but for CPU: SIGXCPU at the limit,
    reported as a timeout, and SIGKILL a second later). Each is lowered to the caller's own hard limit
    where that is lower (only root may raise one), so the child never fails to start over it. With a
    setpriv prefix the limits are set on setpriv and carried by the program it execs."""
    pairs: list[tuple[int, tuple[int, int]]] = []
    for which, value in limits.items():
        _, cap = resource.getrlimit(which)
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        if cap != resource.RLIM_INFINITY:
            value, hard = min(value, cap), min(hard, cap)
        pairs.append((which, (value, hard)))

    def preexec() -> None:
        for which, pair in pairs:
            resource.setrlimit(which, pair)

    return preexec


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class _Finished:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    timed_out: bool
    overflowed: bool


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    return reader, transport


def _kill_pipe_holders(inodes: set[int]) -> None:
    """SIGKILL every process holding one of these pipes but us and our children: what a program forked
    and moved out of its process group (setsid) while keeping its stdout. Our children are spared because
    a child of ours being spawned holds every fd of ours until its exec, and the program itself, also our
    child, was killed with its group. Best effort, Linux only (it reads /proc); a process that also closed
    the pipes is beyond it, and beyond harm to the verdict."""
    names, me = {f"pipe:[{i}]" for i in inodes}, os.getpid()
    with contextlib.suppress(OSError), os.scandir("/proc") as procs:
        for entry in procs:
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        continue
                with os.scandir(f"/proc/{entry.name}/fd") as fds:
                    if any(os.readlink(fd.path) in names for fd in fds):
                        os.kill(int(entry.name), signal.SIGKILL)


async def run_limited(argv: Sequence[str], *, stdin: bytes | None, timeout_s: float, limits: dict[int, int],
                      env: dict[str, str], cwd: Path, stdout_limit: int) -> _Finished:
    """Run argv in a new session under `limits`, feeding stdin while reading stdout (at most stdout_limit
    bytes: one more and the group is killed) and the head of stderr. The group is killed at timeout_s,
    and also as soon as the command ends: nothing it started outlives it, nor keeps our pipes open. stdout
    and stderr are our own pipes (not asyncio's PIPE) so that we know their inodes, and so that wait()
    means the process's exit on every Python version."""
    loop = asyncio.get_running_loop()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    inodes = {os.fstat(out_r).st_ino, os.fstat(err_r).st_ino}
    transports: list[asyncio.BaseTransport] = []
    try:
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=out_w, stderr=err_w, cwd=cwd, env=env, start_new_session=True,
            preexec_fn=_limits_preexec(limits))
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    overflowed = False
    out_reader, out_tr = await _pipe_reader(out_r)
    err_reader, err_tr = await _pipe_reader(err_r)
    transports += [out_tr, err_tr]

    async def feed() -> None:
        assert proc.stdin is not None
        pipe = proc.stdin.get_extra_info("pipe")
        if pipe is not None:
            inodes.add(os.fstat(pipe.fileno()).st_ino)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin or b"")
            await proc.stdin.drain()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.close()

    async def read_stdout() -> bytes:
        nonlocal overflowed
        chunks, size = [], 0
        while chunk := await out_reader.read(1 << 16):
            size += len(chunk)
            if size > stdout_limit:
                overflowed = True
                _killpg(proc.pid)
                break
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_stderr() -> bytes:
        kept = bytearray()
        while chunk := await err_reader.read(1 << 16):
            kept += chunk[:max(0, STDERR_KEEP_BYTES - len(kept))]
        return bytes(kept)

    waiter = asyncio.ensure_future(proc.wait())
    out_task, err_task = asyncio.ensure_future(read_stdout()), asyncio.ensure_future(read_stderr())
    tasks = [waiter, out_task, err_task] + ([asyncio.ensure_future(feed())] if stdin is not None else [])
    try:
        await asyncio.wait([waiter], timeout=timeout_s)
        timed_out = not waiter.done() and not overflowed
        seconds = time.monotonic() - t0
        _killpg(proc.pid)
        _, rest = await asyncio.wait(tasks, timeout=0.2)  # the pipes drain, or close as the group dies
        if rest:  # something it forked left the group and holds a pipe
            await loop.run_in_executor(None, _kill_pipe_holders, inodes)
            await asyncio.wait(rest, timeout=KILL_GRACE_S)
    finally:
        for task in tasks:
            task.cancel()
        _killpg(proc.pid)
        for transport in transports:
            transport.close()
    return _Finished(
        returncode=proc.returncode,
        stdout=out_task.result() if out_task.done() and not out_task.cancelled() else b"",
        stderr=err_task.result() if err_task.done() and not err_task.cancelled() else b"",
        seconds=seconds, timed_out=timed_out, overflowed=overflowed)


