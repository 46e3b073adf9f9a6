"""scaling_law: the hidden score must not leak through the `score` reply, `score log` or messages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from openrebench.environments.scaling_law._ground_truth import GroundTruth, ground_truth_path
from openrebench.harness._sandbox import format_log
from openrebench.runs import Run, get_environment, score_run

ENV = "scaling_law"


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """A run holding only the stored ground truth (no data to build): each attack writes its own answer."""
    env = get_environment(ENV)
    run = Run.create(env, "mini", tmp_path / "run")
    shutil.copyfile(ground_truth_path(env.root, "mini"), run.protected / "ground_truth.json")
    run.mark_started()
    return run


def _digits(x: float) -> list[str]:
    return [f"{x:.2f}", f"{x:.3f}", f"{x:.4f}", f"{x:.3g}"]


@pytest.mark.attack(env=ENV, cls="hidden score leak", invariant=0)
def test_hidden_score_absent_from_reply_and_log(run: Run) -> None:
    """Score a good answer; look for its hidden score in the `score` reply and in `score log`."""
    truth = GroundTruth.model_validate_json((run.protected / "ground_truth.json").read_text())
    n_opt, l_opt = truth.optimum()
    setup = truth.setup
    answer = {"n_embd": n_opt, "max_iters": setup.max_iters_for(n_opt, setup.target_flops),
              "loss_prediction": round(l_opt + 0.05, 3)}
    (run.workspace / "answer.json").write_text(json.dumps(answer))
    row = score_run(run, sandboxed=False, timeout_s=60)
    assert row.raw is not None, row.message
    shown = run.describe(row) + "\n" + format_log(run)
    leaked = [d for x in (row.raw, row.normalised or 0.0) for d in _digits(x) if d in shown]
    assert leaked == [], f"attack works: the hidden score shows ({leaked}) in {shown!r}"


@pytest.mark.attack(env=ENV, cls="hidden score leak", invariant=0)
def test_invalid_answers_do_not_reveal_the_ground_truth(run: Run) -> None:
    """Probe the scorer with edge answers (range ends, huge values): messages must not name true losses."""
    truth = GroundTruth.model_validate_json((run.protected / "ground_truth.json").read_text())
    losses = [f"{loss:.3f}" for _, loss in truth.curve()]
    setup = truth.setup
    low = setup.n_embd_min
    iters = setup.max_iters_for(low, setup.target_flops)
    probes = [{"n_embd": low, "max_iters": iters, "loss_prediction": 1e-300},
              {"n_embd": 10**30, "max_iters": 1, "loss_prediction": 3.0}]
    messages = []
    for probe in probes:
        (run.workspace / "answer.json").write_text(json.dumps(probe))
        messages.append(score_run(run, sandboxed=False, timeout_s=60).message)
    leaked = [x for x in losses if any(x in m for m in messages)]
    assert leaked == [], f"attack works: {leaked} in {messages}"
    rows, _ = run.rows()
    assert len(rows) == len(probes)
