"""scaling_law on the mini tier: the workspace, answer validation, the stored ground truth, the start and
reference scores, a hidden score whose last valid row counts, and the reference procedure's fit.

No sweep runs here: the scorer uses the stored mini ground truth. The reference procedure is checked
on a reduced grid and on synthetic data; the answer it reached when the constants were measured ships
in reference/answer--mini.json, which set-up takes instead of running the procedure again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from openrebench.api import OpenRebenchError
from openrebench.environments.scaling_law import _assets
from openrebench.environments.scaling_law._ground_truth import GroundTruth, ground_truth_path
from openrebench.environments.scaling_law.experiment import Setup, run_experiment
from openrebench.environments.scaling_law.scorer import score
from openrebench.harness._sandbox import format_log
from openrebench.lm import GPT
from openrebench.runs import Run, final_score, get_environment, score_run, start_run

pytest_plugins = ["lm_support"]

ENV = get_environment("scaling_law")
SPEC = ENV.tier("mini")
SETUP = SPEC.params.setup
TRUTH = GroundTruth.model_validate_json(ground_truth_path(ENV.root, "mini").read_text())
SHIPPED_ANSWER = _assets.shipped_answer_path(ENV.root, "mini")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models train fastest on one thread, and far slower on two when the machine is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def sl_home(lm_home: Path, lm_sources: Path) -> Path:
    """The mini corpus in the tier's compact vocabulary (the ground truth is checked against it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        _assets.data_for(SPEC, lm_home)
    return lm_home


@pytest.fixture
def run(sl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A mini run with the starting answer, set up as any run is but without building the reference
    answer (minutes of training that only the reference's placing needs; the data are built)."""
    monkeypatch.setenv("OPENREBENCH_HOME", str(sl_home))
    with monkeypatch.context() as mp:
        mp.setattr(type(ENV), "build_assets", lambda self, tier, cache_dir: None)
        return start_run(ENV, "mini", tmp_path / "run", score_start=False)[0]


def _fit_module() -> Any:
    spec = importlib.util.spec_from_file_location("scaling_law_reference", ENV.root / "reference" / "fit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _write(run: Run, answer: object) -> None:
    text = answer if isinstance(answer, str) else json.dumps(answer)
    (run.workspace / "answer.json").write_text(text)


def test_workspace_has_data_setup_and_answer_but_not_the_ground_truth(run: Run) -> None:
    ws = run.workspace
    for name in ("data/train.bin", "data/val.bin", "data/vocab.json", "setup.json", "train.py",
                 "answer.json"):
        assert (ws / name).is_file(), name
    assert not list(ws.rglob("heldout*")) and not list(ws.rglob("ground_truth*"))
    assert GroundTruth.model_validate_json((run.protected / "ground_truth.json").read_text()) == TRUTH
    assert Setup.model_validate_json((ws / "setup.json").read_text()) == SETUP
    assert "1e12" in ENV.instructions("mini") and "5e10" in ENV.instructions("mini")


def test_flop_formula_counts_the_model_as_nanogpt_does() -> None:
    for n_embd in (8, 24, 64, 128):
        model = GPT(SETUP.gpt_config(n_embd))
        assert SETUP.params(n_embd) == model.num_params()
        assert SETUP.flops_per_token(n_embd) == model.flops_per_token()
        iters = SETUP.max_iters_for(n_embd, SETUP.target_flops)
        assert abs(SETUP.flops(n_embd, iters) / SETUP.target_flops - 1) < 0.01


def _valid(n_embd: int = 48, loss: object = 2.8) -> dict[str, object]:
    return {"n_embd": n_embd, "max_iters": SETUP.max_iters_for(n_embd, SETUP.target_flops),
            "loss_prediction": loss}


@pytest.mark.parametrize(("answer", "reason"), [
    (None, "there is no answer.json"),
    ("{not json", "not valid JSON"),
    ("[48, 1000, 2.8]", "must hold a JSON object"),
    ({**_valid(), "n_embd": "48"}, "n_embd: input should be a valid integer"),
    ({**_valid(), "n_embd": 48.0}, "n_embd: input should be a valid integer"),
    ({**_valid(), "max_iters": True}, "max_iters: input should be a valid integer"),
    ({"n_embd": 48, "max_iters": 1000}, "lacks loss_prediction"),
    ('{"n_embd": 48, "max_iters": 1737, "loss_prediction": NaN}', "loss_prediction: input should be a fin"),
    (_valid(loss=-1.0), "loss_prediction must be a loss"),
    ({**_valid(), "max_iters": 2 * SETUP.max_iters_for(48, SETUP.target_flops)}, "must use the target"),
    ({**_valid(), "max_iters": SETUP.max_iters_for(48, SETUP.target_flops) - 100}, "must use the target"),
    (_valid(n_embd=44), "multiple of 8"),
    (_valid(n_embd=16), "between 24 and 128"),
    (_valid(n_embd=256), "between 24 and 128"),
])
def test_invalid_answers_get_one_line_reasons(run: Run, answer: object, reason: str) -> None:
    if answer is None:
        (run.workspace / "answer.json").unlink()
    else:
        _write(run, answer)
    result = score(SPEC, run.workspace, run.protected)
    assert result.raw is None
    assert result.message.startswith("Invalid: ") and "\n" not in result.message
    assert reason in result.message, result.message


def test_interpolation_is_exact_at_the_points_and_linear_in_log_width_between() -> None:
    curve = TRUTH.curve()
    assert [w for w, _ in curve] == SPEC.params.sweep.widths
    assert all(len([p for p in TRUTH.points if p.n_embd == w]) == 2 for w, _ in curve)
    for w, loss in curve:
        assert TRUTH.loss_at(w) == loss
    (w0, l0), (w1, l1) = curve[0], curve[1]
    mid = TRUTH.loss_at(28)
    t = (np.log(28) - np.log(w0)) / (np.log(w1) - np.log(w0))
    assert mid == pytest.approx(l0 + t * (l1 - l0))
    n_opt, l_opt = TRUTH.optimum()
    assert l_opt == min(loss for _, loss in curve) and SETUP.n_embd_min < n_opt < SETUP.n_embd_max
    with pytest.raises(ValueError, match="outside"):
        TRUTH.loss_at(16)


def test_a_perfect_answer_scores_one_and_errors_cost_their_size(run: Run) -> None:
    n_opt, l_opt = TRUTH.optimum()
    _write(run, _valid(n_opt, l_opt))
    assert score(SPEC, run.workspace, run.protected).raw == pytest.approx(1.0)
    _write(run, _valid(n_opt, l_opt + 0.25))
    assert score(SPEC, run.workspace, run.protected).raw == pytest.approx(0.75)
    _write(run, _valid(128, TRUTH.loss_at(128)))
    assert score(SPEC, run.workspace, run.protected).raw == pytest.approx(1 - (TRUTH.loss_at(128) - l_opt))


def test_start_and_reference_score_their_constants_and_the_score_stays_hidden(run: Run) -> None:
    constants = SPEC.default_constants
    start = score_run(run, sandboxed=False)
    assert start.raw == pytest.approx(constants.start, abs=1e-9) and start.normalised == 0
    answer = json.loads(SHIPPED_ANSWER.read_text())["answer"]
    _write(run, answer)
    ref = score_run(run, sandboxed=False)
    assert ref.raw == pytest.approx(constants.reference, abs=1e-9)
    assert ref.normalised == pytest.approx(1.0)
    for row in (start, ref):
        shown = run.describe(row) + format_log(run)
        assert f"{row.raw:.4f}" not in shown and f"{row.raw:.3f}" not in shown
        assert f"{row.details['l_interp']:.3f}" not in shown and "normalised" not in shown
        assert row.message.startswith("Valid: ") and "hidden" in row.message


def test_the_last_valid_answer_counts(run: Run) -> None:
    n_opt, l_opt = TRUTH.optimum()
    _write(run, _valid(n_opt, l_opt))
    good = score_run(run, sandboxed=False)
    _write(run, _valid(128, 3.5))
    worse = score_run(run, sandboxed=False)
    _write(run, _valid(44))
    invalid = score_run(run, sandboxed=False)
    assert good.raw is not None and worse.raw is not None and invalid.raw is None and good.raw > worse.raw
    rows, _ = run.rows()
    raw, _ = final_score(rows, ENV.direction, run.info.constants)
    assert raw == worse.raw


def test_a_missing_or_stale_ground_truth_is_one_clear_line(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(ENV), "root", property(lambda self: tmp_path))
    full = ENV.tier("full")
    with pytest.raises(OpenRebenchError) as e:
        _assets.load_ground_truth(ENV, full, full.params.setup, data=None)  # type: ignore[arg-type]
    assert "no ground truth yet" in str(e.value)
    assert "`openrebench build scaling_law --tier full --ship`" in str(e.value)
    assert "\n" not in str(e.value)
    (tmp_path / "reference").mkdir()
    ground_truth_path(tmp_path, "mini").write_text(TRUTH.model_dump_json())
    with pytest.raises(OpenRebenchError, match="different training setup"):
        _assets.load_ground_truth(ENV, SPEC, SETUP.model_copy(update={"learning_rate": 1e-3}),
                                  data=None)  # type: ignore[arg-type]


def test_train_py_refuses_runs_over_the_cap_and_reports_a_small_one(run: Run) -> None:
    def train(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "train.py", *args], cwd=run.workspace, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})

    over = train("--n_embd", "64", "--flops", "1e11")
    assert over.returncode != 0 and "refused" in over.stderr and "cap" in over.stderr
    small = train("--n_embd", "8", "--max_iters", "5")
    assert small.returncode == 0, small.stderr
    result = json.loads(small.stdout.strip().splitlines()[-1])
    assert result["max_iters"] == 5 and 4 < result["loss"] < 8
    assert (run.workspace / "results.jsonl").read_text().count("\n") == 1


def test_the_fit_recovers_a_known_law() -> None:
    fit = _fit_module()
    true = fit.Law(E=1.8, A=40.0, alpha=0.4, B=300.0, beta=0.35, rmse=0.0)
    rng = np.random.default_rng(0)
    p = SPEC.params.reference

    def experiment(w: int, iters: int) -> float:
        return true(SETUP.params(w), iters * SETUP.tokens_per_iter) + rng.normal(0, 0.003)

    report = fit.solve(SETUP, experiment, budget_fractions=p.budget_fractions, widths=p.widths,
                       min_iters=p.min_iters)
    answer = report["answer"]
    truth = {w: true(SETUP.params(w), SETUP.max_iters_for(w, SETUP.target_flops) * SETUP.tokens_per_iter)
             for w in range(SETUP.n_embd_min, SETUP.n_embd_max + 1, SETUP.head_size)}
    assert truth[answer["n_embd"]] - min(truth.values()) < 0.01
    assert answer["loss_prediction"] == pytest.approx(truth[answer["n_embd"]], abs=0.03)


def test_the_reference_procedure_runs_end_to_end_on_a_reduced_grid(sl_home: Path) -> None:
    data = _assets.data_for(SPEC, sl_home)
    small = SETUP.model_copy(update={"eval_batches": 4})

    def experiment(n_embd: int, max_iters: int) -> float:
        return run_experiment(small, n_embd, max_iters, data.bin_path("train"), data.bin_path("val")).loss

    report = _fit_module().solve(small, experiment, budget_fractions=[0.02, 0.04, 0.08], widths=[8, 16],
                                 min_iters=15)
    assert [(g["n_embd"], g["max_iters"]) for g in report["grid"]] == [(8, 20), (8, 41), (16, 17), (8, 82),
                                                                      (16, 34)]
    assert all(2 < g["loss"] < 7 for g in report["grid"])
    answer = report["answer"]
    flops = SETUP.flops(answer["n_embd"], answer["max_iters"])
    assert SETUP.width_problem(answer["n_embd"], answer=True) is None
    assert abs(flops / SETUP.target_flops - 1) <= SETUP.budget_tolerance


def test_failures_against_the_ground_truth_say_nothing_of_it(run: Run,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.environments.scaling_law import scorer

    def leaky(self: GroundTruth, n_embd: int) -> float:
        raise ValueError(f"L_opt is {self.optimum()[1]!r} at n_embd={self.optimum()[0]}")

    monkeypatch.setattr(GroundTruth, "loss_at", leaky)
    result = score(SPEC, run.workspace, run.protected)
    assert result.raw is None and result.message == scorer.UNSCORABLE
    assert repr(TRUTH.optimum()[1]) not in result.model_dump_json()


def test_the_constants_live_with_the_hidden_reference() -> None:
    """The starting answer is public, so its score would give L_opt away: the constants are read from
    reference/ (masked in sandboxes), and a placeholder stands in where that is unreadable."""
    from openrebench.environments.scaling_law import env as env_module

    source = Path(env_module.__file__).read_text()
    for tier in ("mini", "full"):
        assert repr(ENV.tier(tier).default_constants.start) not in source
    assert SPEC.default_constants.start == pytest.approx(score_answer_of_start())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(env_module, "__file__", "/nonexistent/env.py")
        assert env_module.hidden_constants("mini").source.startswith("not readable here")


def score_answer_of_start() -> float:
    from openrebench.environments.scaling_law.scorer import Answer, score_answer

    setup = SPEC.params.setup
    n_embd = SPEC.params.start.n_embd
    answer = Answer(n_embd=n_embd, max_iters=setup.max_iters_for(n_embd, setup.target_flops),
                    loss_prediction=SPEC.params.start.loss_prediction)
    return score_answer(answer, TRUTH)[0]


class _Ran(Exception):
    """The reference procedure was started (its first experiment)."""


def _no_experiments(*args: object, **kwargs: object) -> None:
    raise _Ran


def test_set_up_takes_the_shipped_reference_answer_where_its_build_key_holds(
        sl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped answer is the procedure's (a minute of training on 2 cores saved at every first
    set-up): used while the setup, procedure, data and fit.py it was built from are this checkout's;
    any of them changed, the procedure runs again."""
    from openrebench.lm import load_manifest

    data = _assets.data_for(SPEC, sl_home)
    monkeypatch.setattr(_assets, "run_experiment", _no_experiments)
    try:
        path = _assets.reference_answer(SPEC, SETUP, data, tmp_path / "a", shipped=SHIPPED_ANSWER)
    except _Ran:
        pytest.fail("the shipped reference answer no longer matches its build key: "
                    "`openrebench build scaling_law --tier mini --ship` makes it again")
    shipped = json.loads(SHIPPED_ANSWER.read_text())
    assert json.loads(path.read_text()) == shipped["answer"]
    assert json.loads((path.parent / "fit.json").read_text()) == shipped["fit"]
    manifest = load_manifest(path.parent)
    assert manifest is not None and manifest.stats["shipped"] is True

    stale = tmp_path / "answer--mini.json"
    shipped["key"]["params"]["fit_sha256"] = "0" * 64  # made by another fit.py
    stale.write_text(json.dumps(shipped))
    for other in (stale, tmp_path / "missing.json", None):
        with pytest.raises(_Ran):
            _assets.reference_answer(SPEC, SETUP, data, tmp_path / "b", shipped=other)
