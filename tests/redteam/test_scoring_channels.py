"""Nothing leaves a scoring through the kernel: code of the solution, run during a scoring (where it sees
held-out data), leaves a secret in every channel it can reach; the agent's sandbox then looks for it in
each. One test per channel.

The scoring here is a real optimize_kernel scoring through the harness: `solution.py` does its work at
import, in the scorer's solution process (the scoring's own uid, in the scoring sandbox). For the channels
whose defence can be switched off in-process (the seccomp filter for the keyrings, the IPC namespaces for
System V IPC and POSIX message queues), a second scoring with that defence off shows the attack working,
so that these tests cannot pass for want of a working attack.
"""

from __future__ import annotations

import asyncio
import json
import platform
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import bwrap_binary
from openrebench.runs import start_run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="syscall numbers")]

KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]  # add_key, keyctl

# Every channel, with the defence that closes it.
CHANNELS = {
    "keyring": "seccomp filter refusing add_key, request_key and keyctl in every sandbox (and the agent's "
               "user namespace, which hides other uids' keys)",
    "sysv_shm": "an IPC namespace per sandbox",
    "sysv_msg": "an IPC namespace per sandbox",
    "posix_mq": "an IPC namespace per sandbox",
    "abstract_socket": "a network namespace per sandbox, and no process of the scoring outlives it",
    "process": "the scoring's cgroup is killed and its PID namespace ends with it",
    "tmp_file": "a private /tmp per sandbox",
    "shm_file": "a private /dev/shm per sandbox",
}

LEAVE = textwrap.dedent('''
    import ctypes, os, socket, struct, sys
    SECRET = {secret!r}
    ADD_KEY, KEYCTL = {key_calls!r}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    left = {{}}

    def attempt(name, fn):
        try:
            fn()
            left[name] = "left"
        except Exception as e:
            left[name] = repr(e)

    def check(value):
        if value == -1 or value is None:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return value

    def keyring():
        serial = check(libc.syscall(ADD_KEY, b"user", b"orb-leak", SECRET, len(SECRET), ctypes.c_int(-4)))
        check(libc.syscall(KEYCTL, 5, serial, 0x3F3F3F3F))  # KEYCTL_SETPERM: everyone may read it

    def sysv_shm():
        shmid = check(libc.shmget(0x0B1E, 4096, 0o1000 | 0o666))
        addr = check(libc.shmat(shmid, None, 0))
        ctypes.memmove(addr, SECRET, len(SECRET))
        libc.shmdt(ctypes.c_void_p(addr))

    def sysv_msg():
        queue = check(libc.msgget(0x0B1F, 0o1000 | 0o666))
        buf = struct.pack("l", 1) + SECRET
        check(libc.msgsnd(queue, buf, len(SECRET), 0))

    def posix_mq():
        mqd = check(libc.mq_open(b"/orbleak", os.O_CREAT | os.O_WRONLY, 0o666, None))
        check(libc.mq_send(mqd, SECRET, len(SECRET), 0))

    def daemon():  # serves the secret on an abstract socket, and tries to outlive the scoring
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", SERVE, "orbleak-daemon"])
            os._exit(0)
        os.wait()

    def files():
        for path in ("/tmp/orbleak", "/dev/shm/orbleak"):
            with open(path, "wb") as f:
                f.write(SECRET)
            os.chmod(path, 0o666)

    SERVE = (
        "import socket,sys,time\\n"
        "s=socket.socket(socket.AF_UNIX); s.bind('\\\\0orbleak'); s.listen(8)\\n"
        "while True:\\n"
        "    c,_=s.accept(); c.sendall(" + repr(SECRET) + "); c.close()\\n")

    for name, fn in (("keyring", keyring), ("sysv_shm", sysv_shm), ("sysv_msg", sysv_msg),
                     ("posix_mq", posix_mq), ("daemon", daemon), ("files", files)):
        attempt(name, fn)
    import time
    time.sleep(0.5)  # the daemon binds

    def prefix_sum(x):
        raise RuntimeError("leaked: " + str(left))
''')

LOOK = textwrap.dedent('''
    import ctypes, json, os, socket, struct
    SECRET = {secret!r}
    ADD_KEY, KEYCTL = {key_calls!r}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    found = {{}}

    def look(name, fn):
        try:
            data = fn()
            found[name] = bool(data) and SECRET in data
        except Exception as e:
            found[name] = False

    def keyring():
        data = b""
        for line in open("/proc/keys").read().splitlines():
            if "orb-leak" in line:
                data += SECRET  # even its description is out
                serial = int(line.split()[0], 16)
                buf = ctypes.create_string_buffer(256)
                n = libc.syscall(KEYCTL, 11, serial, buf, 256)  # KEYCTL_READ
                if n > 0:
                    data += buf.raw[:n]
        return data

    def sysv_shm():
        shmid = libc.shmget(0x0B1E, 0, 0)
        if shmid < 0:
            return b""
        addr = libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
        return ctypes.string_at(addr, len(SECRET))

    def sysv_msg():
        queue = libc.msgget(0x0B1F, 0)
        if queue < 0:
            return b""
        buf = ctypes.create_string_buffer(8 + 256)
        n = libc.msgrcv(queue, buf, 256, 0, 0o4000)  # IPC_NOWAIT
        return buf.raw[8:8 + n] if n > 0 else b""

    def posix_mq():
        mqd = libc.mq_open(b"/orbleak", os.O_RDONLY | os.O_NONBLOCK)
        if mqd < 0:
            return b""
        buf = ctypes.create_string_buffer(8192)
        n = libc.mq_receive(mqd, buf, 8192, None)
        return buf.raw[:n] if n > 0 else b""

    def abstract_socket():
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect("\\0orbleak")
        return s.recv(256)

    def read(path):
        return lambda: open(path, "rb").read()

    for name, fn in (("keyring", keyring), ("sysv_shm", sysv_shm), ("sysv_msg", sysv_msg),
                     ("posix_mq", posix_mq), ("abstract_socket", abstract_socket),
                     ("tmp_file", read("/tmp/orbleak")), ("shm_file", read("/dev/shm/orbleak"))):
        look(name, fn)
    print(json.dumps(found))
''')


def _attack(tmp_path: Path) -> dict[str, bool]:
    """One scoring that leaves the secret everywhere, then the agent's look in every channel."""
    secret = f"HELDOUT-{secrets.token_hex(8)}".encode()
    run = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)[0]
    (run.workspace / "solution.py").write_text(LEAVE.format(secret=secret, key_calls=KEY_CALLS))

    async def scenario() -> dict[str, bool]:
        box = await OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel"))
        try:
            row = await box.score()
            assert row.raw is None and "leaked" in row.message, row.message  # the solution's code ran,
            for done in ("'daemon': 'left'", "'files': 'left'"):  # and left what no defence refuses outright
                assert done in row.message, row.message
            result = await box.exec(["python", "-c", LOOK.format(secret=secret, key_calls=KEY_CALLS)],
                                    timeout=60)
            assert result.success, result.stderr
            found = json.loads(result.stdout)
        finally:
            await box.close()
        found["process"] = any("orbleak-daemon" in " ".join(p.info["cmdline"] or [])
                               for p in psutil.process_iter(["cmdline"]))
        return found

    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def looked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool]:
    return _attack(tmp_path_factory.mktemp("channels"))


@pytest.fixture(scope="module")
def looked_without_defences(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, bool]]:
    """The same attack with the switchable defences off: no seccomp filter, no IPC namespaces, no user
    namespace for the agent (which hides other uids' keys from /proc/keys)."""
    import functools

    from openrebench.harness.backends import bwrap as bwrap_backend
    from openrebench.isolation import _bwrap, _machine
    from openrebench.runs import _scorer_process

    original = _bwrap.bwrap_command

    def shared_ipc(cmd: list[str], spec: _bwrap.SandboxSpec) -> list[str]:
        return [a for a in original(cmd, spec) if a != "--unshare-ipc"]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_bwrap, "seccomp_supported", lambda: False)
        patch.setattr(_scorer_process, "bwrap_command", shared_ipc)
        patch.setattr(_machine, "bwrap_command", shared_ipc)
        no_userns = functools.partial(_machine.MachineSpec, user_namespace=False)
        patch.setattr(bwrap_backend, "MachineSpec", no_userns)
        yield _attack(tmp_path_factory.mktemp("channels-off"))
    _cleanup_host_ipc()


def _cleanup_host_ipc() -> None:
    """What the attack without defences left in the host's IPC namespace and keyrings goes."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    for key, get, rm in ((0x0B1E, libc.shmget, lambda i: libc.shmctl(i, 0, None)),
                         (0x0B1F, libc.msgget, lambda i: libc.msgctl(i, 0, None))):
        ident = get(key, 0, 0) if get is libc.shmget else get(key, 0)
        if ident >= 0:
            rm(ident)  # IPC_RMID
    libc.mq_unlink(b"/orbleak")
    for line in Path("/proc/keys").read_text().splitlines():
        if "orb-leak" in line:
            libc.syscall(KEY_CALLS[1], 21, int(line.split()[0], 16))  # KEYCTL_INVALIDATE
    del os


@pytest.mark.attack(env="all", cls="nothing-leaves", invariant=3)
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_nothing_a_scoring_leaves_reaches_the_agent(looked: dict[str, bool], channel: str) -> None:
    """A scoring's code leaves held-out data in a kernel channel for the agent to read afterwards."""
    assert looked[channel] is False, f"{channel} leaked (defence: {CHANNELS[channel]})"


@pytest.mark.attack(env="all", cls="nothing-leaves", invariant=3)
@pytest.mark.parametrize("channel", ["keyring", "sysv_shm", "sysv_msg", "posix_mq"])
def test_without_its_defence_the_channel_leaks(looked_without_defences: dict[str, bool],
                                               channel: str) -> None:
    """The same attack with the channel's defence switched off reaches the agent (the attack is real)."""
    if channel == "keyring" and not Path("/proc/keys").exists():
        pytest.skip("this kernel has no keyrings")
    assert looked_without_defences[channel] is True, looked_without_defences
