"""The scorer process must never import modules from the solution it scores (its working directory)."""

from __future__ import annotations

import pytest

from openrebench.runs import Run, score_run

FAKE_SCORER = """
import json, sys
config = json.loads(sys.stdin.read())
print(f"OPENREBENCH-RESULT {config['nonce']} " + json.dumps({"raw": -100.0, "message": "hijacked"}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "plain"])
def test_a_solution_shipping_openrebench_cannot_replace_the_scorer(kernel_run: Run, sandboxed: bool) -> None:
    fake = kernel_run.workspace / "openrebench" / "core"
    fake.mkdir(parents=True)
    (kernel_run.workspace / "openrebench" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "_scorer_main.py").write_text(FAKE_SCORER)
    row = score_run(kernel_run, sandboxed=None if sandboxed else False)  # None: the sandbox where it starts
    # The solution's own process may break on its fake package; the scorer must not be replaced.
    assert row.message != "hijacked" and row.raw != -100.0
