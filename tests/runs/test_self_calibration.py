"""A machine-dependent tier calibrates itself on a machine whose fingerprint no record has: once, before
a run's clock, under a lock, and never from scorings disturbed by a busy neighbour. The scorings are
faked here (fixed raw scores, counted); `start_run` then takes the record's constants."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from openrebench.runs import (
    CalibrationRecord,
    Run,
    calibrate,
    calibrate_machine,
    constants_for,
    detect_hardware,
    find_machine_record,
    get_environment,
    start_run,
)
from openrebench.runs import _scoring as scoring
from openrebench.runs import _self_calibration as selfcal

ENV, TIER = "optimize_kernel", "mini"


@pytest.fixture
def unknown_machine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This machine with CPU flags no record has, self-calibration on, and scorings that return fixed
    raw scores: `noisy` says how many calibrations (from the first) spread like a disturbed machine."""
    monkeypatch.setenv(selfcal.SELF_CALIBRATION_ENV, "1")
    hardware = detect_hardware().model_copy(update={"cpu_flags": "never-seen"})
    for module in ("_self_calibration", "_calibration", "_run"):
        monkeypatch.setattr(f"openrebench.runs.{module}.detect_hardware", lambda: hardware)
    state: dict[str, Any] = {"calibrations": 0, "scorings": 0, "noisy": 0, "start": 4.5}

    def fake(env: Any, tier: str, repeats: int, *, command: str, on_progress: Any = None, access: Any = None,
             models: Any = None, probe_repeats: int = 1) -> CalibrationRecord:
        state["calibrations"] += 1
        disturbed = state["calibrations"] <= state["noisy"]
        values = iter([1.0, 3.0, 2.0] * 4)  # a spread far beyond any shipped record's

        def once(which: str) -> tuple[float, str]:
            state["scorings"] += 1
            base = {"start": state["start"], "reference": 2.0}[which]
            return (base + next(values) if disturbed else base + 0.01 * state["scorings"]), "fixed"

        return calibrate(get_environment(env), tier, repeats, score_once=once, command=command,
                         on_progress=on_progress, models=models)

    monkeypatch.setattr(selfcal, "calibrate_environment", fake)
    state["fingerprint"] = hardware.fingerprint("cpu")
    return state


def test_an_unknown_machine_is_calibrated_once_and_its_record_used(unknown_machine: Any) -> None:
    env = get_environment(ENV)
    assert find_machine_record(env, TIER, unknown_machine["fingerprint"]) is None
    record = calibrate_machine(ENV, TIER)
    assert record is not None and record.fingerprint == unknown_machine["fingerprint"]
    assert unknown_machine["scorings"] == 2 * selfcal.SELF_CALIBRATION_REPEATS
    found = find_machine_record(env, TIER, unknown_machine["fingerprint"])
    assert found is not None and found[1] == "local"
    assert calibrate_machine(ENV, TIER) is None and unknown_machine["calibrations"] == 1  # once per machine
    constants = constants_for(env, TIER)
    assert (constants.start, constants.reference) == (record.start.median, record.reference.median)
    assert "made by a run's set-up on this machine" in constants.source


def test_a_run_set_up_for_work_takes_this_machines_constants(unknown_machine: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(scoring, "score_run", lambda run, **kw: seen.append(kw.get("kind", "")))
    run, _ = start_run(ENV, TIER, tmp_path / "run")  # with its set-up scoring: a clock will follow
    assert unknown_machine["calibrations"] == 1 and seen == ["setup"]
    assert "made by a run's set-up on this machine" in run.info.constants.source
    start_run(ENV, TIER, tmp_path / "other", score_start=False)  # calibration's and tests' own runs: none
    assert unknown_machine["calibrations"] == 1


def test_a_start_that_drifts_from_this_machines_record_makes_a_new_one_before_the_clock(
        unknown_machine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine behind the fingerprint now runs the start far faster than its record says (as a cloud
    machine of another generation under the same name did): the set-up scoring shows it, the machine is
    calibrated again, and the run and its set-up row take the new constants."""
    old = calibrate_machine(ENV, TIER)
    assert old is not None and old.start.median > 4.5
    unknown_machine["start"] = 3.0  # from now on
    rows: list[SimpleNamespace] = []

    def setup_scoring(run: Any, **kw: Any) -> SimpleNamespace:
        rows.append(SimpleNamespace(raw=3.0, kind=kw.get("kind"), constants=run.info.constants))
        return rows[-1]

    monkeypatch.setattr(scoring, "score_run", setup_scoring)
    run, row = start_run(ENV, TIER, tmp_path / "run")
    assert unknown_machine["calibrations"] == 2
    assert [r.kind for r in rows] == ["setup", "setup"] and row is rows[-1]
    assert rows[0].constants.start == old.start.median  # the row that showed the drift
    assert 3.0 <= run.info.constants.start < 3.1 and rows[1].constants == run.info.constants
    assert Run.open(run.path).info.constants == run.info.constants  # written with the clock's start
    run2, _ = start_run(ENV, TIER, tmp_path / "again")  # no drift now: no calibration
    assert unknown_machine["calibrations"] == 2 and run2.info.constants.start == run.info.constants.start


def test_a_disturbed_calibration_is_measured_again_and_never_kept(unknown_machine: Any) -> None:
    unknown_machine["noisy"] = 1
    record = calibrate_machine(ENV, TIER)
    assert record is not None and unknown_machine["calibrations"] == 2  # the disturbed one was retried
    assert max(record.start.sd, record.reference.sd) <= selfcal._noise_bound(get_environment(ENV), TIER)


def test_a_machine_disturbed_throughout_keeps_no_record(unknown_machine: Any) -> None:
    unknown_machine["noisy"] = 99
    assert calibrate_machine(ENV, TIER) is None
    assert unknown_machine["calibrations"] == selfcal.SELF_CALIBRATION_TRIES
    assert find_machine_record(get_environment(ENV), TIER, unknown_machine["fingerprint"]) is None
    assert "made by a run's set-up" not in constants_for(get_environment(ENV), TIER).source


def test_two_processes_at_once_calibrate_once(unknown_machine: Any) -> None:
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(calibrate_machine(ENV, TIER)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert unknown_machine["calibrations"] == 1 and sum(r is not None for r in results) == 1


def test_the_fingerprint_is_stable_and_names_the_cores_and_flags() -> None:
    hardware = detect_hardware()
    assert hardware.fingerprint("cpu") == detect_hardware.__wrapped__().fingerprint("cpu")
    assert f"|{hardware.cpu_count} cores|flags " in hardware.fingerprint("cpu")
    other = hardware.model_copy(update={"cpu_flags": "x"})
    assert other.key("cpu") == hardware.key("cpu") and other.fingerprint("cpu") != hardware.fingerprint("cpu")



COUNTER = """import os, sys
i = 0
while True:
    i += 1
    if i % 20000 == 0:
        open(sys.argv[1] + ".new", "w").write(str(i))
        os.replace(sys.argv[1] + ".new", sys.argv[1])
"""


def _count(out: Path) -> int:
    return int(out.read_text() or 0)


def test_a_calibration_has_the_machine_to_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another attempt's agent, busy on the machine, is frozen for the whole calibration (no scoring of
    the calibration sees it move) and thawed after; a calibration waits for a scoring in flight elsewhere
    before it begins."""
    import subprocess
    import sys

    from openrebench.isolation import Cgroup, measurement_slot
    from openrebench.isolation._quiet import registered

    group = Cgroup.create("neighbour", memory_bytes=None, max_pids=64)
    if group is None or not group.can_freeze:
        pytest.skip("no cgroup freezer here")
    out = tmp_path / "count"
    proc = subprocess.Popen([*group.enter_prefix(), sys.executable, "-c", COUNTER, str(out)])
    seen: list[tuple[int, int]] = []
    events: list[str] = []

    def fake_scoring(run: Run, **kw: Any) -> SimpleNamespace:
        before = _count(out)
        threading.Event().wait(0.3)
        seen.append((before, _count(out)))
        return SimpleNamespace(raw=2.0 if run.path.name == "reference" else 4.5, message="fixed")

    monkeypatch.setattr(scoring, "score_run", fake_scoring)
    elsewhere = threading.Event()

    def other_scoring() -> None:  # another run's scoring, in flight when the calibration asks
        with measurement_slot():
            events.append("scoring began")
            elsewhere.set()
            threading.Event().wait(0.5)
            events.append("scoring ended")

    try:
        while not out.exists():
            threading.Event().wait(0.05)
        with registered(group.dirs):
            thread = threading.Thread(target=other_scoring)
            thread.start()
            elsewhere.wait(10)
            record = scoring.calibrate_environment(ENV, TIER, 2, command="test", probe_repeats=0,
                                                   on_progress=lambda *a: events.append("calibration"))
            thread.join()
        moving = _count(out)
        threading.Event().wait(0.5)
        assert _count(out) > moving  # thawed after
    finally:
        proc.kill()
        proc.wait()
        group.close()
    assert events[:2] == ["scoring began", "scoring ended"] and events[2:] == ["calibration"] * 4
    assert len(seen) == 4 and all(before == after for before, after in seen), seen  # frozen throughout
    assert record.start.median == 4.5 and record.reference.median == 2.0
