"""A seccomp filter that closes the kernel's keyrings to every sandbox.

Keyrings are the one uid-keyed store that neither a namespace nor a fresh uid closes: a key whose owner
grants "other" every permission is listed in /proc/keys and readable by serial number from any user
namespace and any uid on the machine. A scoring's code could park a held-out set there for the agent (or
another run) to read afterwards. Refusing `add_key`, `request_key` and `keyctl` closes the whole class:
nothing in a sandbox can create, find or read a key. No ML tool needs them.

The filter is classic BPF, built here (no libseccomp) and handed to bubblewrap's `--seccomp FD`. Calls
of another architecture (32-bit compat) and x86-64's x32 ABI are refused outright, so that the same
calls cannot come in under other numbers.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; ...
_NR, _ARCH = 0, 4
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# Architecture: (AUDIT_ARCH_*, {name: number}) for the calls refused.
_ARCHES = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219}),
}
REFUSED_CALLS = ("add_key", "request_key", "keyctl")


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def supported() -> bool:
    return platform.machine() in _ARCHES


def filter_program(machine: str | None = None) -> bytes:
    """The filter for this machine's architecture: the refused calls fail with EPERM, every other call
    of the native ABI is allowed, every call of a foreign ABI fails with ENOSYS."""
    arch, numbers = _ARCHES[machine or platform.machine()]
    refused = [numbers[name] for name in REFUSED_CALLS]
    deny, foreign = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    # Layout: check arch, load nr, (x32 check), one jeq per refused call, allow, deny, foreign.
    prog = [_insn(_LD_W_ABS, 0, 0, _ARCH)]
    body: list[tuple[int, int, int]] = []  # (code, k, target) with target "deny"=0 / "foreign"=1
    if machine in (None, "x86_64") and arch == _ARCHES["x86_64"][0]:
        body.append((_JGE_K, _X32_BIT, 1))
    body += [(_JEQ_K, nr, 0) for nr in refused]
    n_body = len(body)
    # After the arch check: 1 (ld nr) + n_body jumps + allow; deny is at offset n_body + 2, foreign + 3.
    prog.append(_insn(_JEQ_K, 0, n_body + 3, arch))  # foreign arch: jump to the last instruction
    prog.append(_insn(_LD_W_ABS, 0, 0, _NR))
    for i, (code, k, target) in enumerate(body):
        to_allow = n_body - i - 1  # instructions between this one and "allow"
        jump = to_allow + 1 + target  # past allow to deny (target 0) or foreign (target 1)
        prog.append(_insn(code, jump, 0, k))
    prog += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, deny), _insn(_RET_K, 0, 0, foreign)]
    return b"".join(prog)


def filter_fd() -> int:
    """A readable file descriptor holding the filter (for `bwrap --seccomp FD`; bwrap reads it to the
    end, so each sandbox needs a fresh one). The caller passes it on and closes it."""
    fd = os.memfd_create("openrebench-seccomp", os.MFD_CLOEXEC)
    os.write(fd, filter_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
