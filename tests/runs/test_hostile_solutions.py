"""Broken and hostile solutions each get an invalid row with a clear message; the harness carries on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernel_support import kernel_score
from openrebench.environments.optimize_kernel.env import OptimizeKernel
from openrebench.runs import Run, score_run

CORRECT = textwrap.dedent("""
    import torch

    def prefix_sum(x):
        odd = torch.zeros_like(x, dtype=torch.int64)
        odd[1:] = (x[:-1] > 0).to(torch.int64).cumsum(0) % 2
        return (x.to(torch.int64) * odd).cumsum(0).to(torch.int32)
""")

HOSTILE: dict[str, tuple[str, str]] = {
    "raises": ("def prefix_sum(x):\n    return 1 / 0\n", "prefix_sum raised ZeroDivisionError"),
    "syntax error": ("def prefix_sum(x)\n    return x\n", "failed to import: SyntaxError"),
    "missing function": ("def other(x):\n    return x\n", "does not define a function prefix_sum"),
    "sys.exit at import": ("import sys\nsys.exit(3)\n", "failed to import: SystemExit: 3"),
    "os._exit at import": ("import os\nos._exit(7)\n", "the solution process exited with code 7"),
    "garbage on the channel": ("import os, sys\nos.write(int(sys.argv[3]), b'\\xff' * 64)\n" + CORRECT,
                               "malformed message from the solution process"),
    "returns a list": ("def prefix_sum(x):\n    return x.tolist()\n", "prefix_sum returned list"),
    "wrong dtype": (CORRECT.replace(".to(torch.int32)", ""), "returned dtype torch.int64"),
    "wrong shape": (CORRECT.replace(".to(torch.int32)", ".to(torch.int32)[:-1]"),
                    "prefix_sum returned shape"),
    "wrong values": (CORRECT.replace(".to(torch.int32)", ".to(torch.int32) + 1"),
                     "wrong output for the length 1 input: first difference at index 0"),
    "modifies its input": (CORRECT.replace("    odd = ", "    x.zero_()\n    odd = "),
                           "prefix_sum modified its input"),
    "points the scorer at unmapped memory": (
        "from openrebench.api import HostChannel\n_send = HostChannel.send\n"
        "HostChannel.send = lambda self, m: _send(self, {**m, 'addr': 4096} if 'addr' in m else m)\n"
        + CORRECT, "could not be read after the call"),
    "fills memory": ("import numpy as np\nhog = np.ones(8 * 1024**3, dtype=np.uint8)\n",
                     "used more than 1 GB of memory"),
    "hangs": ("def prefix_sum(x):\n    while True:\n        pass\n",
              "took longer than the 10 s scoring limit"),
}


# Limits only the harness enforces (its memory watch, its wall clock) need the whole scoring pipeline;
# the other cases are the solution host's and the scorer's own, checked in this process on a short input.
THROUGH_THE_HARNESS = ("fills memory", "hangs")


@pytest.mark.slow
@pytest.mark.parametrize("name", THROUGH_THE_HARNESS)
def test_hostile_solution_gets_invalid_row(kernel_run: Run, name: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    code, expected = HOSTILE[name]
    # The harness's memory watch at 1 GB instead of the tier's 6: the same watch, without writing 6 GB.
    spec = OptimizeKernel.tiers["mini"]
    monkeypatch.setitem(OptimizeKernel.tiers, "mini", spec.model_copy(update={"memory_limit_gb": 1}))
    (kernel_run.workspace / "solution.py").write_text(code)
    row = score_run(kernel_run, timeout_s=10 if name == "hangs" else 120)
    assert row.raw is None and row.normalised is None
    assert row.message.startswith("Invalid: ")
    assert expected in row.message, row.message
    assert "Traceback" not in row.message.split("\n")[0]
    rows, warnings = kernel_run.rows()
    assert rows[-1] == row and warnings == []


@pytest.mark.parametrize("name", [n for n in HOSTILE if n not in THROUGH_THE_HARNESS])
def test_hostile_solution_is_invalid_in_the_scorer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   name: str) -> None:
    code, expected = HOSTILE[name]
    result = kernel_score(monkeypatch, tmp_path, code)
    assert result.raw is None and result.message.startswith("Invalid: ")
    assert expected in result.message, result.message
    assert "Traceback" not in result.message.split("\n")[0]


@pytest.mark.slow
def test_missing_solution_file(kernel_run: Run) -> None:
    (kernel_run.workspace / "solution.py").unlink()
    row = score_run(kernel_run)
    assert row.raw is None and "solution.py is missing" in row.message


@pytest.mark.slow
def test_output_spam_and_links_do_not_break_scoring(kernel_run: Run) -> None:
    """A correct solution that floods stdout/stderr and links to protected data still scores."""
    (kernel_run.protected / "secret.txt").write_text("held-out")
    (kernel_run.workspace / "peek.txt").symlink_to(kernel_run.protected / "secret.txt")
    spam = ("import sys\nfor _ in range(2000):\n"
            "    print('{\"raw\": -100}' * 20)\n    sys.stderr.write('x' * 500)\n")
    (kernel_run.workspace / "solution.py").write_text(spam + CORRECT)
    row = score_run(kernel_run)
    assert row.raw is not None, row.message
    assert row.message.startswith("Valid: correct on 8 inputs")
    assert row.details["snapshot_notes"] == ["skipped link peek.txt"]


KILLER = textwrap.dedent("""
    import os, signal
    parent = os.getppid()
    with open(f"/proc/{parent}/stat") as f:
        grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
    for pid in (parent, grandparent):
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
    raise SystemExit("still alive")
""")


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [False, True], ids=["pid-namespace", "bwrap"])
def test_solution_cannot_kill_the_harness(kernel_run: Run, sandboxed: bool) -> None:
    """It tries to kill the scorer and the harness: in the scorer's PID namespace neither is
    reachable; in the scoring sandbox (as root) the solution runs as another uid than the scorer."""
    from openrebench.isolation import bwrap_usable
    from openrebench.isolation._namespace import pid_namespace_prefix

    if not pid_namespace_prefix():
        pytest.skip("no PID namespaces on this machine (unshare unavailable)")
    if sandboxed and bwrap_usable():
        pytest.skip(f"no scoring sandbox: {bwrap_usable()}")
    (kernel_run.workspace / "solution.py").write_text(KILLER)
    row = score_run(kernel_run, timeout_s=90, sandboxed=sandboxed)
    assert row.raw is None
    assert ("failed to import: SystemExit: still alive" in row.message
            or "PermissionError: [Errno 1] Operation not permitted" in row.message), row.message


@pytest.mark.slow
def test_solution_that_kills_its_parent_gives_invalid_row(kernel_run: Run, monkeypatch) -> None:
    """Without a PID namespace the scorer can be killed: the harness reports it and carries on."""
    from openrebench.isolation import _namespace as _isolation

    monkeypatch.setattr(_isolation, "pid_namespace_prefix", lambda: ())
    monkeypatch.setattr("openrebench.runs._scorer_process.pid_namespace_prefix", lambda: ())
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    (kernel_run.workspace / "solution.py").write_text(killer)
    row = score_run(kernel_run, timeout_s=20, sandboxed=False)
    assert row.raw is None
    assert "the scorer process was killed by signal SIGKILL" in row.message
