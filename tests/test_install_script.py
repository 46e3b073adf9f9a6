"""scripts/install.py: `make install` hands pip's configuration to uv, so both install the same releases."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_settings_reach_uv_with_the_environment_over_the_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /from/file\nextra-index-url = file:///a/simple file:///b/simple\n"
                      "constraint = /etc/caps.txt\ncert = /etc/ca.pem\ntimeout = 42\n")
    for name in [k for k in os.environ if k.startswith("PIP_")] + ["SSL_CERT_FILE", "UV_HTTP_TIMEOUT"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/env")
    install = _script()
    settings = install.pip_config()
    assert settings["find-links"] == "/from/env"  # pip's order: the variable wins over the file
    assert settings["extra-index-url"] == "file:///a/simple file:///b/simple"
    cmd, env = install.uv_command(["-e", ".[dev]"], settings)
    assert cmd[:5] == [sys.executable, "-m", "uv", "pip", "install"]
    pairs = list(itertools.pairwise(cmd))
    assert ("--find-links", "/from/env") in pairs and ("--find-links", "/from/file") not in pairs
    assert {("--extra-index-url", f"file:///{x}/simple") for x in "ab"} <= set(pairs)
    assert ("--constraint", "/etc/caps.txt") in pairs
    assert ("--index-strategy", "unsafe-best-match") in pairs and "--compile-bytecode" in cmd
    assert cmd[-2:] == ["-e", ".[dev]"]
    assert env["UV_HTTP_TIMEOUT"] == "42" and env["SSL_CERT_FILE"] == "/etc/ca.pem"


def test_no_packages_is_a_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script().main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python scripts/install.py")
