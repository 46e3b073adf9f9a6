"""A tier's kept Triton cache (`TierSpec.triton_cache`, optimize_kernel's full tier): what a scoring's
solution adds reaches the run's next scoring, as the harness's read-only copy; links and anything over
the size limit are not kept; the cache lives out of the workspace. Checked on the mini tier with the
flag set on the harness's side (the cache is the harness's doing, not the scorer's), with solutions
that stop at import, so each scoring takes seconds."""

from __future__ import annotations

import os

import pytest

from openrebench.runs import Run, get_environment, score_run
from openrebench.runs import _scoring as scoring

WRITE = """
import os, pathlib
cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
(cache / "k1").mkdir()
(cache / "k1" / "kernel.cubin").write_text("compiled")
os.symlink("/etc/passwd", cache / "k1" / "link")
raise RuntimeError("written")
"""

READ = """
import os, pathlib
k1 = pathlib.Path(os.environ["TRITON_CACHE_DIR"]) / "k1"
raise RuntimeError(f"seen={(k1 / 'kernel.cubin').read_text()} link={os.path.lexists(k1 / 'link')} "
                   f"writable={os.access(k1 / 'kernel.cubin', os.W_OK)}")
"""

FLOOD = """
import os, pathlib
(pathlib.Path(os.environ["TRITON_CACHE_DIR"]) / "big").write_bytes(b"x" * (2 << 20))
raise RuntimeError("flooded")
"""


@pytest.mark.slow
def test_a_kept_triton_cache_carries_a_scorings_kernels_to_the_next(kernel_run: Run,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if not scoring.scoring_sandbox_default():
        pytest.skip("the kept cache is bound into the scoring sandbox, which this machine cannot make")
    env = get_environment("optimize_kernel")
    monkeypatch.setitem(type(env).tiers, "mini", env.tier("mini").model_copy(update={"triton_cache": True}))
    monkeypatch.setattr(scoring, "TRITON_CACHE_BYTES", 1 << 20)

    def scored(code: str) -> tuple[str, str]:
        (kernel_run.workspace / "solution.py").write_text(code)
        row = score_run(kernel_run, charged=False)
        return row.message, str(row.details.get("triton_cache"))

    store = kernel_run.path / "scoring-cache" / "triton"
    message, kept = scored(WRITE)
    assert "written" in message and kept == "kept", (message, kept)
    assert (store / "k1" / "kernel.cubin").read_text() == "compiled"
    assert not os.path.lexists(store / "k1" / "link")  # a link is never kept
    assert kernel_run.workspace not in store.parents  # the agent's sandbox sees the workspace only

    message, kept = scored(READ)
    # the next scoring sees it; as root the harness keeps it read-only to the solution's own uid
    writable = os.geteuid() != 0
    assert f"seen=compiled link=False writable={writable}" in message, message

    message, kept = scored(FLOOD)
    assert "flooded" in message and kept.startswith("dropped"), (message, kept)
    assert not store.exists()  # the next scoring compiles again
