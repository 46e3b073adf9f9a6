"""Shipped data are written by package commands: `openrebench calibrate --ship` (calibration records) and
`openrebench build` (an environment's `build_shipped` hook). No scoring or sweep runs here: the
measurement is replaced by a fixed record, and scaling_law's sweep by its stored ground truth."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pytest
from typer.testing import CliRunner

from openrebench.cli import _calibrate, app
from openrebench.environments.scaling_law import _assets, _shipped
from openrebench.environments.scaling_law._ground_truth import GroundTruth, ground_truth_path
from openrebench.runs import CalibrationRecord, calibrate, find_record, get_environment

UNWRITABLE = Path("/proc/self/openrebench-environment")  # not even root can make a folder here


def invoke(*args: str) -> tuple[int, str]:
    """The command as a shell runs it (the commands record their own command line from sys.argv)."""
    with patch.object(sys, "argv", ["/venv/bin/openrebench", *args]):
        result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def one_line_error(code: int, out: str, message: str) -> None:
    assert code == 1, out
    assert message in out, out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


def _move_root(monkeypatch: pytest.MonkeyPatch, env_id: str, root: Path) -> None:
    """The environment's folder, as the package ships it, somewhere else (a temporary copy)."""
    monkeypatch.setattr(type(get_environment(env_id)), "root", property(lambda self: root))


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`calibrate` without scoring: a record of fixed raw scores; the list names each calibration."""
    calls: list[str] = []

    def fixed(env_id: str, tier: str, repeats: int, *, command: str, on_progress: Any = None,
              access: Any = None, models: Any = None, probe_repeats: int = 1) -> CalibrationRecord:
        calls.append(env_id)
        raw = {"start": 2.0, "reference": 1.0}
        return calibrate(get_environment(env_id), tier, repeats, command=command, on_progress=on_progress,
                         score_once=lambda which: (raw[which], "fixed"), models=models)

    monkeypatch.setattr(_calibrate, "calibrate_environment", fixed)
    return calls


def test_calibrate_ship_writes_the_record_the_package_ships(tmp_path: Path, measured: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _move_root(monkeypatch, "optimize_kernel", tmp_path / "optimize_kernel")
    code, out = invoke("calibrate", "optimize_kernel", "--tier", "mini", "--repeats", "2", "--ship")
    assert code == 0, out
    assert measured == ["optimize_kernel"] and "record shipped in" in out
    (path,) = (tmp_path / "optimize_kernel" / "calibration").glob("mini--cpu-*.json")
    record = CalibrationRecord.model_validate_json(path.read_text())
    assert record.start.values == [2.0, 2.0]
    assert record.command == "openrebench calibrate optimize_kernel --tier mini --repeats 2 --ship"
    env = get_environment("optimize_kernel")
    shutil.rmtree(tmp_path / "home", ignore_errors=True)
    monkeypatch.setenv("OPENREBENCH_HOME", str(tmp_path / "home"))  # no local record: the shipped one counts
    found = find_record(env, "mini", record.hardware_key)
    assert found is not None and found[1] == "shipped" and found[0] == record


def test_calibrate_ship_refuses_a_folder_it_cannot_write_before_measuring(
        measured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _move_root(monkeypatch, "optimize_kernel", UNWRITABLE)
    code, out = invoke("calibrate", "optimize_kernel", "--tier", "mini", "--ship")
    one_line_error(code, out, "error: optimize_kernel's calibration folder")
    assert "cannot be written" in out and measured == []


def test_calibrate_ship_refuses_an_installed_copy_before_measuring(
        tmp_path: Path, measured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A plug-in installed from a wheel: its folder may be writable, but a record written there is lost at
    the next install and shipped to no one."""
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "toy" / "optimize_kernel"
    installed.mkdir(parents=True)
    _move_root(monkeypatch, "optimize_kernel", installed)
    code, out = invoke("calibrate", "optimize_kernel", "--tier", "mini", "--ship")
    one_line_error(code, out, "error: optimize_kernel's calibration folder")
    assert "is an installed copy of the package" in out and measured == []
    assert not (installed / "calibration").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("build", "optimize_kernel"), "error: optimize_kernel ships no built data (it has no build_shipped "
                                   "hook); its calibration records are written by `openrebench calibrate "
                                   "optimize_kernel --tier mini --ship`"),
    (("build", "nope"), "error: unknown environment 'nope'"),
    (("build", "scaling_law", "--tier", "huge"), "error: unknown tier 'huge' for scaling_law"),
    (("build", "scaling_law", "--ship", "--out", "OUT"), "error: give --ship or --out, not both"),
])
def test_build_refuses_bad_input_in_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    code, out = invoke(*(str(tmp_path / a) if a == "OUT" else a for a in args))
    one_line_error(code, out, message)
    assert not (tmp_path / "OUT").exists()


@pytest.fixture
def swept() -> list[str]:
    """The commands of the sweeps `stored_sweep` ran."""
    return []


@pytest.fixture
def stored_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swept: list[str]) -> GroundTruth:
    """scaling_law's build with the sweep replaced by the stored mini ground truth (as a sweep whose
    every point came from the cache returns it, with a new date and command; `swept` counts its calls)
    and the reference procedure by the answer it reached (as shipped)."""
    from openrebench.lm import cached_build

    env = get_environment("scaling_law")
    stored = GroundTruth.model_validate_json(ground_truth_path(env.root, "mini").read_text())
    shipped = json.loads(_assets.shipped_answer_path(env.root, "mini").read_text())
    folder = tmp_path / "reference-answer"

    def sweep(spec: Any, setup: Any, data: Any, cache: Any, *, command: str, **kwargs: Any) -> GroundTruth:
        assert kwargs["widths"] == spec.params.sweep.widths and kwargs["seeds"] == [0, 1]
        swept.append(command)
        return stored.model_copy(update={"command": command, "seconds": 1.0})

    def reference_answer(spec: Any, setup: Any, data: Any, cache: Any) -> Path:
        def build(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            (partial / "answer.json").write_text(json.dumps(shipped["answer"]))
            (partial / "fit.json").write_text(json.dumps(shipped["fit"]))
            return {}, {"device": "cpu"}

        cached_build(folder, what="answer:test", builder_version="1", seed=0, params={}, build=build)
        return folder / "answer.json"

    files = {name: SimpleNamespace(sha256=getattr(stored.data, f"{name[:-4]}_sha256"))
             for name in ("train.bin", "heldout.bin")}
    data = SimpleNamespace(kind=stored.data.corpus, manifest=SimpleNamespace(files=files))
    monkeypatch.setattr(_shipped, "sweep", sweep)
    monkeypatch.setattr(_assets, "data_for", lambda spec, cache: data)
    monkeypatch.setattr(_assets, "reference_answer", reference_answer)
    return stored


def test_build_writes_scaling_law_s_ground_truth_and_checks_it(tmp_path: Path, stored_sweep: GroundTruth,
                                                               swept: list[str]) -> None:
    code, out = invoke("build", "scaling_law", "--tier", "mini", "--out", str(tmp_path / "out"))
    assert code == 0, out
    assert swept == [f"openrebench build scaling_law --tier mini --out {tmp_path / 'out'}"]
    written = ground_truth_path(tmp_path / "out", "mini")
    assert f"written: {written}" in out and "to ship them" in out
    answer = _assets.shipped_answer_path(tmp_path / "out", "mini")
    assert f"written: {answer}" in out
    stored = json.loads(answer.read_text())  # with the key of the build it came from
    assert stored["key"]["what"] == "answer:test" and stored["device"] == "cpu"
    assert stored["answer"] == json.loads(
        _assets.shipped_answer_path(get_environment("scaling_law").root, "mini").read_text())["answer"]
    truth = GroundTruth.model_validate_json(written.read_text())
    assert truth.points == stored_sweep.points
    assert truth.command == f"openrebench build scaling_law --tier mini --out {tmp_path / 'out'}"
    constants = json.loads((get_environment("scaling_law").root / "reference" / "constants.json").read_text())
    for which in ("start", "reference"):  # exact for the stored ground truth
        assert f"raw {constants['mini'][which]:.4f}" in out


def test_build_ship_keeps_a_whole_stored_sweep_and_runs_the_reference_procedure_itself(
        tmp_path: Path, stored_sweep: GroundTruth, swept: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored sweep of every width and seed on this data is kept (the record of the run that made it),
    not swept again; the reference answer is made by the procedure, not copied from the shipped one."""
    from openrebench.lm import cached_build

    env = get_environment("scaling_law")
    copied = _assets.reference_answer_path(env.tier("mini"), None).parent  # set-up's copy of the shipped
    cached_build(copied, what="answer:copy", builder_version="1", seed=0, params={},
                 build=lambda partial, deadline: ({}, {"shipped": True}))
    shipped = tmp_path / "scaling_law"
    shutil.copytree(env.root, shipped, ignore=shutil.ignore_patterns("__pycache__"))
    before = ground_truth_path(shipped, "mini").read_bytes()
    _move_root(monkeypatch, "scaling_law", shipped)
    code, out = invoke("build", "scaling_law", "--tier", "mini", "--ship")
    assert code == 0, out
    assert swept == [] and "kept, not swept again" in out
    assert ground_truth_path(shipped, "mini").read_bytes() == before
    assert not copied.exists()
    answer = json.loads(_assets.shipped_answer_path(shipped, "mini").read_text())
    assert answer["key"]["what"] == "answer:test"
    assert "to ship them" not in out


def test_build_ship_refuses_a_folder_it_cannot_write(stored_sweep: GroundTruth,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _move_root(monkeypatch, "scaling_law", UNWRITABLE)
    code, out = invoke("build", "scaling_law", "--tier", "mini", "--ship")
    one_line_error(code, out, "error: scaling_law's folder")
