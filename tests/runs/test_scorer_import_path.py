"""The scorer process must never import modules from the solution it scores (its working directory),
and imports the one environment it scores, by the class path the harness names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from openrebench.runs import score_run, start_run

FAKE_SCORER = """
import json, sys
config = json.loads(sys.stdin.read())
print(f"OPENREBENCH-RESULT {config['nonce']} " + json.dumps({"raw": -100.0, "message": "hijacked"}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "plain"])
def test_a_solution_shipping_openrebench_cannot_replace_the_scorer(tmp_path: Path, sandboxed: bool) -> None:
    run = start_run("example_fit", "mini", tmp_path / "run", score_start=False)[0]  # a scoring in a second
    for package in ("core", "runs"):
        fake = run.workspace / "openrebench" / package
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("")
        (fake / "_scorer_main.py").write_text(FAKE_SCORER)
    (run.workspace / "openrebench" / "__init__.py").write_text("")
    row = score_run(run, sandboxed=None if sandboxed else False)  # None: the sandbox where it starts
    # The solution's own process may break on its fake package; the scorer must not be replaced.
    assert row.message != "hijacked" and row.raw != -100.0
    assert row.valid and row.normalised == pytest.approx(0.0, abs=1e-9), row.message  # the start, scored


@pytest.mark.parametrize("named", [True, False], ids=["class path", "id only"])
def test_the_scorer_process_imports_only_the_environment_it_scores(tmp_path: Path, named: bool) -> None:
    """Named by the harness (`env_class`), the environment's class is imported alone; an older harness's
    config (the id only) still works, through the registry, which imports every built-in one."""
    from openrebench.runs._registry import class_path

    run = start_run("example_fit", "mini", tmp_path / "run", score_start=False)[0]
    config = {"env_id": "example_fit", "tier": "mini", "nonce": "n", "solution": str(run.workspace),
              "protected": str(run.protected), **({"env_class": class_path("example_fit")} if named else {})}
    out = subprocess.run([sys.executable, "-X", "importtime", "-P", "-m", "openrebench.runs._scorer_main"],
                         input=json.dumps(config), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("OPENREBENCH-RESULT n ")]
    assert json.loads(line.split(" ", 2)[2])["raw"] is not None, line
    builtins = {x.split("|")[-1].strip() for x in out.stderr.splitlines() if "openrebench.environments." in x}
    assert (builtins == set()) if named else len(builtins) >= 7, sorted(builtins)
