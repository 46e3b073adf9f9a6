"""Adding an environment is one new package and zero edits elsewhere: a toy environment, written here
into a temporary folder as its own package with an entry point in `openrebench.environments`, is
listed, started, scored (in the scoring sandbox where bubblewrap starts, else in a plain process), run
by `inspect eval openrebench/toy_sum` and `openrebench eval`, and analysed, with nothing of openrebench
changed. A fresh process finds it on PYTHONPATH; this process through sys.path and `refresh()`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from inspect_ai.log import list_eval_logs, read_eval_log
from typer.testing import CliRunner

from openrebench.cli import app
from openrebench.isolation import SandboxSpec, bwrap_command, bwrap_usable, plugin_code
from openrebench.isolation._bwrap import PLUGIN_ROOT, hidden_package_dirs, package_root, python_roots
from openrebench.runs import Run, environment_classes, get_environment, refresh
from openrebench.runs._scoring import scoring_sandbox_default

PACKAGE = "toyenv_plugin"

TOY_ENV = '''
"""toy_sum: write the sum of 1 to 10 into answer.txt; the raw score is the distance from 55."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from openrebench.api import Direction, Environment, NormConstants, ScoreResult, TierSpec


class ToySum(Environment):
    id = "toy_sum"
    rebench_id = "toy_sum"
    title = "Toy: the sum of 1 to 10"
    version = "0.1.0"
    direction = Direction.MIN
    tiers: ClassVar[dict[str, TierSpec]] = {
        "mini": TierSpec(
            name="mini", description="CPU, instant.", device="cpu", hardware="any CPU",
            time_limit_hours=0.5, score_timeout_s=120, memory_limit_gb=4,
            constants=NormConstants(start=55.0, reference=0.0, source="the answers' distances")),
    }

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        try:
            answer = int((solution / "answer.txt").read_text()[:32].strip())
        except (OSError, ValueError):
            return ScoreResult.invalid("Invalid: answer.txt must hold an integer.")
        return ScoreResult(raw=float(abs(answer - 55)), message=f"Valid: answer {answer}.")
'''


def write_toy_plugin(root: Path) -> Path:
    """The toy environment as an installed distribution would lay it out on the import path: the
    package and a dist-info folder whose entry_points.txt names the class."""
    package = root / PACKAGE
    for folder, answer in (("starting", "0"), ("reference", "55")):
        (package / folder).mkdir(parents=True)
        (package / folder / "answer.txt").write_text(f"{answer}\n")
    (package / "__init__.py").write_text('"""A toy openrebench environment in a package of its own."""\n')
    (package / "env.py").write_text(TOY_ENV.lstrip())
    (package / "instructions.md").write_text("Write the sum of the integers 1 to 10 into answer.txt "
                                             "($tier tier, $time_limit).\n")
    meta = root / f"{PACKAGE}-0.1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: toyenv-plugin\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text("[openrebench.environments]\ntoy_sum = toyenv_plugin.env:ToySum\n")
    (root / "beside.txt").write_text("not the plug-in's: no sandbox may see this\n")
    return root


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_toy_plugin(tmp_path_factory.mktemp("site"))


@pytest.fixture
def installed(plugin_dir: Path) -> Iterator[Path]:
    """The toy on this process's import path for one test, and gone again after it."""
    sys.path.insert(0, str(plugin_dir))
    refresh()
    try:
        yield plugin_dir
    finally:
        sys.path.remove(str(plugin_dir))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]
        refresh()


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_registry_finds_the_plugin_and_forgets_it(installed: Path) -> None:
    assert "toy_sum" in environment_classes()
    assert get_environment("toy_sum").root == installed / PACKAGE
    assert "toy_sum" in invoke("list")
    (code,) = [c for c in plugin_code() if c.packages == ((installed / PACKAGE).resolve(),)]
    assert code.metadata == (installed / f"{PACKAGE}-0.1.0.dist-info").resolve()
    # Its reference solution is masked in every sandbox, as the built-in environments' are.
    assert str((installed / PACKAGE / "reference").resolve()) in hidden_package_dirs()


def test_start_and_score_a_run_in_and_out_of_the_scoring_sandbox(
        installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    out = invoke("start", "toy_sum", "--tier", "mini", str(run_dir))
    assert "Write the sum of the integers 1 to 10" in out
    run = Run.open(run_dir)
    (setup,), _ = run.rows()
    assert (setup.raw, setup.normalised) == (55.0, 0.0), setup
    assert setup.details["sandboxed"] is scoring_sandbox_default()  # the sandbox wherever bwrap starts
    shutil.copyfile(installed / PACKAGE / "reference" / "answer.txt", run.workspace / "answer.txt")
    # Unsandboxed, the scorer is a fresh process all the same: it finds the plug-in, although it was
    # put on this process's import path only, not on PYTHONPATH.
    monkeypatch.setenv("OPENREBENCH_SCORE_SANDBOX", "0")
    assert "answer 55" in invoke("score", str(run_dir))
    rows, _ = run.rows()
    assert rows[-1].normalised == 1.0 and rows[-1].details["sandboxed"] is False
    assert "normalised: 1.000" in invoke("result", str(run_dir))


@pytest.mark.skipif(bwrap_usable() is not None, reason="bubblewrap does not start here")
def test_the_scoring_sandbox_shows_the_plugin_read_only_and_nothing_beside_it(installed: Path) -> None:
    probe = textwrap.dedent(f"""
        import os, pathlib, sys
        from importlib.metadata import entry_points
        import {PACKAGE}
        root = pathlib.Path({PACKAGE}.__file__).parent
        entry = root.parent
        writable = []
        for target in (entry / "planted.py", root / "planted.py"):
            try:
                target.write_text("")
                writable.append(str(target))
            except OSError:
                pass
        print(json.dumps({{"entry": str(entry), "listing": sorted(os.listdir(entry)),
                          "reference": os.listdir(root / "reference"), "writable": writable,
                          "host_path": os.path.exists({str(installed)!r}),
                          "entry_points": [e.name for e in entry_points(group="openrebench.environments")]}}))
        """)
    spec = SandboxSpec(binds=[], cwd="/tmp", plugins=True, drop_privileges=False)
    out = subprocess.run(bwrap_command([sys.executable, "-P", "-c", "import json\n" + probe], spec),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["entry"].startswith(PLUGIN_ROOT + "/") and "toy_sum" in seen["entry_points"]
    # and no entry point but the installed plug-ins' (the example package, where installed)
    installed = {e.name for e in entry_points(group="openrebench.environments")}
    assert set(seen["entry_points"]) <= {"toy_sum", *installed}
    assert seen["listing"] == [PACKAGE, f"{PACKAGE}-0.1.0.dist-info"]  # not beside.txt
    assert seen["reference"] == [] and seen["writable"] == [] and seen["host_path"] is False


@pytest.mark.skipif(bwrap_usable() is not None, reason="bubblewrap does not start here")
def test_the_scoring_sandbox_finds_a_package_reached_only_through_pythonpath() -> None:
    """A checkout used by PYTHONPATH alone (no install, no .pth file: a GPU machine with only the
    sources): the scorer's sandbox clears the environment, yet its Python must still find openrebench.
    `-S` leaves out site-packages and its .pth files, so only PYTHONPATH can find it."""
    root = package_root()
    if any(str(root) == r or str(root).startswith(r + "/") for r in python_roots()):
        pytest.skip("the package is installed in the Python installation here")
    probe = "import importlib.util; print(importlib.util.find_spec('openrebench').origin)"
    spec = SandboxSpec(binds=[], cwd="/tmp", plugins=True, drop_privileges=False)
    out = subprocess.run(bwrap_command([sys.executable, "-S", "-P", "-c", probe], spec),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(root / "openrebench" / "__init__.py")


@pytest.mark.slow
def test_inspect_and_openrebench_eval_run_it_and_analyze_reads_the_logs(
        installed: Path, tmp_path: Path) -> None:
    # Inspect, in a fresh process that finds the plug-in on PYTHONPATH, knows the task by name.
    inspect = Path(sys.executable).parent / "inspect"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(installed),
                                                                     os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(inspect), "eval", "openrebench/toy_sum", "-T", "tier=mini", "-T",
                             f"runs_dir={tmp_path / 'runs'}", "--model", "none", "--log-dir",
                             str(tmp_path / "inspect"), "--display", "none"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    (info,) = list_eval_logs(str(tmp_path / "inspect"))
    log = read_eval_log(info)
    assert log.status == "success" and log.samples and log.samples[0].scores
    assert log.samples[0].scores["rebench_scorer"].value == 1.0

    out = invoke("eval", "toy_sum", "--tier", "mini", "--log-dir", str(tmp_path / "eval"), "--runs-dir",
                 str(tmp_path / "runs"), "--display", "none")
    assert "toy_sum" in out and "1.000" in out

    analysis = json.loads(invoke("analyze", str(tmp_path / "inspect"), str(tmp_path / "eval"), "--json",
                                 "--boots", "10", "--sims", "10"))
    assert analysis["settings"]["environments"] == ["toy_sum"]
    (group,) = analysis["groups"]
    assert group["runs_by_env"] == {"toy_sum": 2} and group["mean_score"] == 1.0
    assert not any("toy_sum" in n for n in analysis["notes"])

    # The plug-in uninstalled: its logs still load, read as the logs recorded the environment.
    sys.path.remove(str(installed))
    refresh()
    try:
        analysis = json.loads(invoke("analyze", str(tmp_path / "eval"), "--json", "--boots", "10",
                                     "--sims", "10"))
    finally:
        sys.path.insert(0, str(installed))
    assert analysis["groups"][0]["runs_by_env"] == {"toy_sum": 1}
    assert any(n.startswith("toy_sum is not a registered environment") and "score visible, direction min"
               in n for n in analysis["notes"])


SCORED_BY_PATH = '''
from typing import ClassVar

from openrebench.api import Direction, Environment, NormConstants, TierSpec


class Counted(Environment):
    id = "counted"
    rebench_id = "counted"
    title = "Toy: files counted"
    version = "0.1.0"
    direction = Direction.MAX
    scorer = ".scoring:count"  # relative to this package: no score method to copy
    tiers: ClassVar[dict[str, TierSpec]] = {
        "mini": TierSpec(name="mini", description="CPU.", device="cpu", hardware="any CPU",
                         time_limit_hours=0.5, score_timeout_s=60, memory_limit_gb=1,
                         constants=NormConstants(start=0.0, reference=3.0, source="by hand"))}
'''

SCORING = '''
from openrebench.api import ScoreResult


def count(spec, solution, protected):
    return ScoreResult(raw=float(len(list(solution.iterdir()))), message=f"Valid: counted on {spec.name}.")
'''


def test_an_environment_names_its_scorer_by_import_path(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scorer as `module:function`, called with the tier's spec: the environment writes no score
    method; a class that names none and overrides nothing is refused by the registry in one line."""
    from openrebench.api import Direction, Environment, OpenRebenchError
    from openrebench.runs._registry import _check

    package = tmp_path / "counted_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text(SCORED_BY_PATH)
    (package / "scoring.py").write_text(SCORING)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    cls = importlib.import_module("counted_pkg.env").Counted
    solution = tmp_path / "solution"
    solution.mkdir()
    for name in ("a", "b"):
        (solution / name).write_text(name)
    result = _check(cls, "counted")().score("mini", solution, tmp_path)
    assert result.raw == 2.0 and result.message == "Valid: counted on mini."

    class Unscored(Environment):
        id, rebench_id, title, version, direction, tiers = "unscored", "unscored", "x", "1", Direction.MAX, {}

    with pytest.raises(OpenRebenchError, match="names no scorer"):
        _check(Unscored, "unscored")
