"""Tier constants come from the calibration records the environments ship, never from copies: every tier
with a record for its reference hardware reads its defaults from it, and a missing or broken record is
one clear line, raised when the constants are first needed (never when the environment is imported)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from openrebench.api import NormConstants, TierSpec
from openrebench.api._calibration import Hardware
from openrebench.base import OpenRebenchError
from openrebench.environments.optimize_kernel.params import KernelParams
from openrebench.runs import constants_for, environment_classes, get_environment

TIERS = [(env_id, tier) for env_id, cls in environment_classes().items() for tier in cls.tiers]


@pytest.mark.parametrize(("env_id", "tier"), TIERS, ids=[f"{e}-{t}" for e, t in TIERS])
def test_each_tier_reads_its_constants_from_its_shipped_record(env_id: str, tier: str) -> None:
    env = get_environment(env_id)
    spec = env.tier(tier)
    shipped = sorted((env.root / "calibration").glob(f"{tier}--*.json"))
    if spec.calibration is None:  # only where nothing was measured; the tier says why, next to its constants
        assert not shipped, f"{env_id} {tier} ships {shipped[0].name} but does not read its constants from it"
        assert spec.constants is not None
        return
    assert spec.calibration in shipped, f"{spec.calibration} is not one of {env_id}'s shipped records"
    record = json.loads(spec.calibration.read_text())  # read here on its own, not through the loader
    assert (record["env_id"], record["tier"]) == (env_id, tier)
    assert record["hardware_key"].startswith(f"{spec.device}:")
    constants = spec.default_constants
    medians = (record["start"]["median"], record["reference"]["median"])
    assert (constants.start, constants.reference) == medians
    assert spec.calibration.name in constants.source and record["env_version"] in constants.source
    assert spec.constants is None


def _spec(**sources: object) -> TierSpec[KernelParams]:
    return TierSpec.model_validate({
        "name": "mini", "description": "test", "device": "cpu", "hardware": "any CPU", "time_limit_hours": 1,
        "score_timeout_s": 60, "memory_limit_gb": 1, **sources,
        "params": KernelParams(length=8, warmup_calls=1, timed_calls=1, call_timeout_s=1, setup_timeout_s=1)})


def _one_line(path: Path) -> str:
    with pytest.raises(OpenRebenchError) as e:
        _ = _spec(calibration=path).default_constants
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_missing_or_broken_record_is_one_clear_line(tmp_path: Path) -> None:
    assert "cannot be read" in _one_line(tmp_path / "mini--gone.json")
    (tmp_path / "mini--garbled.json").write_text("{not json")
    assert "is broken" in _one_line(tmp_path / "mini--garbled.json")
    shipped = get_environment("optimize_kernel").tier("mini").calibration
    assert shipped is not None
    record = json.loads(shipped.read_text())
    del record["reference"]
    (tmp_path / "mini--incomplete.json").write_text(json.dumps(record))
    assert "reference" in _one_line(tmp_path / "mini--incomplete.json")
    full = get_environment("optimize_kernel").tier("full").calibration
    assert full is not None
    assert "of the full tier, not mini" in _one_line(full)


def test_a_tier_names_exactly_one_source_of_constants(tmp_path: Path) -> None:
    by_hand = NormConstants(start=1, reference=0, source="hand")
    assert _spec(constants=by_hand).default_constants == by_hand
    with pytest.raises(ValidationError, match="either its shipped calibration record"):
        _spec()
    with pytest.raises(ValidationError, match="either its shipped calibration record"):
        _spec(calibration=tmp_path / "x.json", constants=by_hand)
    with pytest.raises(ValidationError, match="default_constants"):  # refused, not silently dropped
        _spec(default_constants=by_hand)


def test_this_hardwares_record_comes_first_then_the_tiers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 the kernel's full tier reads its own record; once the environment's major version moves
    past the record's (its scoring changed), the record no longer counts as the H200's own: the default,
    read from that same record, stands in and says so."""
    env = get_environment("optimize_kernel")
    spec = env.tier("full")
    assert spec.calibration is not None
    record = json.loads(spec.calibration.read_text())
    h200 = Hardware.model_validate(record["hardware"])
    constants = constants_for(env, "full", h200)
    assert constants.source.startswith("shipped calibration on cuda:NVIDIA H200")
    medians = (record["start"]["median"], record["reference"]["median"])
    assert (constants.start, constants.reference) == medians
    major = int(record["env_version"].split(".")[0])
    monkeypatch.setattr(type(env), "version", f"{major + 1}.0.0")
    stale = constants_for(env, "full", h200)
    assert (stale.start, stale.reference) == (spec.default_constants.start, spec.default_constants.reference)
    assert record["env_version"] in stale.source and "no calibration for cuda:NVIDIA H200" in stale.source
    restricted = get_environment("restricted_mlm")
    shipped = restricted.tier("full").calibration
    assert shipped is not None
    h200 = Hardware.model_validate(json.loads(shipped.read_text())["hardware"])
    found = constants_for(restricted, "full", h200)
    assert found.source.startswith("shipped calibration on cuda:NVIDIA H200")
    other = h200.model_copy(update={"gpu_model": "NVIDIA A100-SXM4-80GB"})
    elsewhere = constants_for(restricted, "full", other)
    assert elsewhere.source.endswith("(no calibration for cuda:NVIDIA A100-SXM4-80GB: tier default)")
    assert elsewhere.start == restricted.tier("full").default_constants.start


def test_a_tier_with_models_is_calibrated_per_model() -> None:
    """rust_codecontests' score is the task model's as much as the machine's: a record made with another
    task model is found only by runs given that model, and a run whose model has no record is told how
    to calibrate one (its constants stay the tier's, said to be for the default model)."""
    from datetime import UTC, datetime

    from openrebench.api._calibration import CalibrationRecord, Stats
    from openrebench.runs import detect_hardware, save_record, user_calibration_dir

    env = get_environment("rust_codecontests")
    hardware = detect_hardware()
    other = {"task_model": "openai/gpt-4o-mini"}
    default = constants_for(env, "mini", hardware)
    unknown = constants_for(env, "mini", hardware, other)
    assert (unknown.start, unknown.reference) == (default.start, default.reference)
    assert "not with task_model=openai/gpt-4o-mini" in unknown.source
    assert "--env-model task_model=openai/gpt-4o-mini" in unknown.source
    record = CalibrationRecord(
        env_id=env.id, env_version=env.version, tier="mini", hardware_key=hardware.key("cpu"),
        hardware=hardware,
        start=Stats.of([0.0, 0.0, 0.0]), reference=Stats.of([0.3, 0.4, 0.5]), models=other,
        measured_at=datetime.now(UTC), command="openrebench calibrate", package_version="0")
    path = save_record(record, user_calibration_dir(env.id))
    assert "task-model-openai-gpt-4o-mini" in path.name
    mine = constants_for(env, "mini", hardware, other)
    assert (mine.start, mine.reference) == (0.0, 0.4) and "with task_model=openai/gpt-4o-mini" in mine.source
    again = constants_for(env, "mini", hardware)  # the default model's runs do not take it
    assert (again.start, again.reference) == (default.start, default.reference)


def test_calibration_scores_the_probes_beside_start_and_reference() -> None:
    """Probes (solutions that game the scorer) are scored after the start and the reference and kept in
    the record; one whose every scoring is invalid is counted as such and does not end the calibration."""
    from openrebench.runs._calibration import calibrate

    env = get_environment("chat_rl")
    asked: list[str] = []
    values = {"start": 0.4, "reference": 0.7, "probe:fixed": 0.2, "probe:broken": None}

    def score_once(which: str) -> tuple[float | None, str]:
        asked.append(which)
        return values[which], "Invalid: broken." if values[which] is None else "Valid."

    record = calibrate(env, "mini", 2, score_once=score_once, command="test", probes=["fixed", "broken"],
                       probe_repeats=3)
    assert asked == ["start"] * 2 + ["reference"] * 2 + ["probe:fixed"] * 3 + ["probe:broken"] * 3
    assert record.probes["fixed"].values == [0.2] * 3 and "broken" not in record.probes
    assert record.invalid == {"probe:broken": 3}
    assert (record.start.median, record.reference.median) == (0.4, 0.7)


def test_a_record_made_from_scorings_run_elsewhere_is_the_one_calibrate_makes() -> None:
    """A benchmark's scoring rows replayed into a record (benchmarks/rust_codecontests.py --record,
    benchmarks/optimize_kernel_gpu_checks.py): values in order, invalid rows counted, not valued."""
    from openrebench.runs._calibration import record_of_scorings

    env = get_environment("rust_codecontests")
    rows = {"start": [{"raw": 0.0, "message": "Valid."}, {"raw": None, "message": "Invalid: x."},
                      {"raw": 0.04, "message": "Valid."}],
            "reference": [{"raw": 0.25, "message": "Valid."}, {"raw": 0.2, "message": "Valid."},
                          {"raw": 0.21, "message": "Valid."}],
            "other": [{"raw": 9.0, "message": "Valid."}]}
    record = record_of_scorings(env, "mini", rows, command="bench", models={"task_model": "local"})
    assert record.start.values == [0.0, 0.04] and record.reference.values == [0.25, 0.2, 0.21]
    assert record.invalid == {"start": 1} and record.command == "bench"
    assert record.models == {"task_model": "local"}
    with pytest.raises(ValueError, match="3 start scorings but 2 of the reference"):
        record_of_scorings(env, "mini", {**rows, "reference": rows["reference"][:2]}, command="bench")
