"""The worked example of an environment plug-in (examples/example-env, installed by `make install`):
found through its entry point, calibrated from nothing (its first record bootstraps the tier), run
through `demo` and `eval`, and scored in its solution host with bad solutions invalid in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openrebench.cli import app
from openrebench.runs import (
    Run,
    environment_classes,
    get_environment,
    install_reference,
    score_run,
    start_run,
)

pytestmark = pytest.mark.skipif("example_fit" not in environment_classes(),
                                reason="the example package is not installed (make install installs it)")
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), terminal_width=200)
    return result.exit_code, result.output


def test_demo_scores_the_start_zero_and_the_reference_one(tmp_path: Path) -> None:
    code, out = invoke("demo", "example_fit", "--dir", str(tmp_path / "run"))
    assert code == 0, out
    rows, _ = Run.open(tmp_path / "run").rows()
    start, reference = rows[0], rows[-1]
    assert start.kind == "setup" and start.normalised == pytest.approx(0.0, abs=1e-9)
    assert reference.normalised == pytest.approx(1.0, abs=1e-9)
    assert reference.raw < start.raw  # lower is better: ln(mean squared error)


def test_eval_with_the_oracle_scores_one(tmp_path: Path) -> None:
    from inspect_ai.log import list_eval_logs, read_eval_log

    code, out = invoke("eval", "example_fit", "--agent", "oracle", "--display", "none",
                       "--log-dir", str(tmp_path / "logs"), "--runs-dir", str(tmp_path / "runs"))
    assert code == 0, out
    (info,) = list_eval_logs(str(tmp_path / "logs"))
    (sample,) = read_eval_log(info).samples or []
    assert sample.scores["rebench_scorer"].value == pytest.approx(1.0)


def test_a_new_tier_calibrates_from_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hand-typed constants: a tier naming a record that does not exist yet refuses runs with the
    command to run, and `calibrate --ship` measures it and writes it as the tier's default."""
    import shutil

    cls = environment_classes()["example_fit"]
    package = tmp_path / "package"  # the package as its author has it before any calibration
    shutil.copytree(get_environment("example_fit").root, package,
                    ignore=shutil.ignore_patterns("calibration"))
    monkeypatch.setattr(cls, "root", property(lambda self: package))
    default = package / "calibration" / "mini--any-cpu.json"
    monkeypatch.setitem(cls.tiers, "mini", cls.tiers["mini"].model_copy(update={"calibration": default}))

    code, out = invoke("start", "example_fit", str(tmp_path / "early"))
    assert code == 1 and "not calibrated yet" in out
    assert "openrebench calibrate example_fit --tier mini --ship" in out
    assert len(out.strip().splitlines()) == 1 and not (tmp_path / "early").exists()

    code, out = invoke("calibrate", "example_fit", "--repeats", "2", "--ship")
    assert code == 0, out
    record = json.loads(default.read_text())
    assert record["env_id"] == "example_fit" and len(record["start"]["values"]) == 2
    assert record["reference"]["median"] < record["start"]["median"]

    monkeypatch.setenv("OPENREBENCH_HOME", str(tmp_path / "other-home"))  # no user record: the default
    run, row = start_run("example_fit", "mini", tmp_path / "later")
    assert row is not None and row.normalised == pytest.approx(0.0, abs=1e-9)
    assert run.info.constants.start == pytest.approx(record["start"]["median"])


BROKEN = {
    "no predict": ("def fit():\n    pass\n", "must define predict"),
    "raises": ("def predict(xs):\n    raise ValueError('nope')\n", "predict(xs) raised ValueError: nope"),
    "wrong length": ("def predict(xs):\n    return [0.0]\n", "a list of 500 numbers, got 1"),
    "not numbers": ("def predict(xs):\n    return ['a'] * len(xs)\n", "predict(xs) raised ValueError"),
    "nan": ("def predict(xs):\n    return [float('nan')] * len(xs)\n", "finite numbers only"),
    "syntax error": ("def predict(xs) return xs\n", "failed to import: SyntaxError"),
}


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return start_run("example_fit", "mini", tmp_path_factory.mktemp("example") / "run", score_start=False)[0]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_solution_is_invalid_in_one_line(example_run: Run, case: str) -> None:
    source, message = BROKEN[case]
    (example_run.workspace / "solution.py").write_text(source)
    row = score_run(example_run)
    assert not row.valid and message in row.message, row.message
    assert "Traceback" not in row.message.splitlines()[0]


def test_the_reference_is_hidden_and_scores_in_its_host(example_run: Run) -> None:
    env = get_environment("example_fit")
    assert not (example_run.workspace / "heldout.json").exists()
    assert (example_run.protected / "heldout.json").is_file()
    install_reference(example_run)
    row = score_run(example_run)
    assert row.valid and row.normalised == pytest.approx(1.0, abs=1e-9), row.message
    assert env.root.joinpath("reference", "solution.py").is_file()
