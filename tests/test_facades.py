"""The packages' facades are closed: no module imports another package's private module (a name
starting with `_`); what one package uses of another comes through that package's `__init__`. The
import-linter contracts (`make lint`) keep the layers' order; this keeps their doors."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import openrebench

ROOT = Path(openrebench.__file__).parent


def _owner(module: list[str]) -> tuple[str, ...]:
    """Whose privacy a module path is: the package, or for environments the environment."""
    return tuple(module[1:3]) if len(module) > 2 and module[1] == "environments" else tuple(module[1:2])


def _private_imports_across_packages() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        here = ["openrebench", *path.relative_to(ROOT).with_suffix("").parts]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                if parts[0] != "openrebench" or _owner(parts) == _owner(here):
                    continue
                inside = parts[1 + len(_owner(parts)):]
                if any(p.startswith("_") for p in inside):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {target}")
    return found


def test_no_module_imports_another_packages_private_module() -> None:
    found = _private_imports_across_packages()
    assert not found, "imports of other packages' private modules (use the package):\n" + "\n".join(found)


def test_the_check_finds_such_an_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan itself: a module of `runs` importing `isolation._bwrap` (even inside a function) is
    reported, as is an environment importing another's private module; its own are not."""
    fake = tmp_path / "openrebench"
    (fake / "runs").mkdir(parents=True)
    (fake / "runs" / "x.py").write_text("def f():\n    from openrebench.isolation._bwrap import Bind\n")
    (fake / "environments" / "toy").mkdir(parents=True)
    (fake / "environments" / "toy" / "env.py").write_text(
        "from openrebench.environments.toy._a import b\nfrom openrebench.environments.other._a import c\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert _private_imports_across_packages() == [
        "openrebench/environments/toy/env.py:2: openrebench.environments.other._a",
        "openrebench/runs/x.py:2: openrebench.isolation._bwrap"]



def test_the_analysis_reads_logs_without_the_harness() -> None:
    """Prices (the gateway's) and time limits (the runs layer's) come from below the harness: no module of
    the analysis imports it. (Inspect itself imports the harness's task registry through its entry point
    when it reads a log; that is Inspect's loading of plug-ins, not the analysis's.)"""
    root = Path(openrebench.__file__).parent / "analysis"
    found = [f"{path.name}: {name}" for path in sorted(root.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                          else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
             if name.startswith("openrebench.harness")]
    assert not found, found
