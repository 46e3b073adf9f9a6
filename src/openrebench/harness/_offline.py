"""Offline use of Inspect AI: the tiktoken encodings it loads, without their download site.

Inspect counts tokens with tiktoken's o200k_base, which tiktoken downloads on first use. Offline,
`install_from_litellm_wheel()` (run by `make install`) takes the encodings from the
`litellm` wheel on PyPI, which ships them under tiktoken's cache names (sha1 of their URL), and
puts them in this installation's share folder; importing the harness points TIKTOKEN_CACHE_DIR there
unless the user set it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# sha1 of https://openaipublic.blob.core.windows.net/encodings/<name>.tiktoken: tiktoken's cache names.
ENCODINGS = {"o200k_base": "fb374d419588a4632f3f557e76b4b70aebbca790",
             "cl100k_base": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"}
CACHE = Path(sys.prefix) / "share" / "openrebench" / "tiktoken"


def use_local_tiktoken_cache() -> None:
    if "TIKTOKEN_CACHE_DIR" not in os.environ and (CACHE / ENCODINGS["o200k_base"]).is_file():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(CACHE)


def install_from_litellm_wheel() -> None:
    """Fill the cache from PyPI's litellm wheel (downloaded without its dependencies, then unzipped)."""
    if all((CACHE / sha).is_file() for sha in ENCODINGS.values()):
        print(f"tiktoken encodings already in {CACHE}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", tmp, "litellm"], check=True)
        (wheel,) = Path(tmp).glob("litellm-*.whl")
        CACHE.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for sha in ENCODINGS.values():
                (CACHE / sha).write_bytes(zf.read(f"litellm/litellm_core_utils/tokenizers/{sha}"))
    print(f"tiktoken encodings installed in {CACHE}")
