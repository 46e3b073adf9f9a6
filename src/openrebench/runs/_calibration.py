"""Calibration: measure the start and reference raw scores on this hardware and keep them as records.

A run fixes its normalisation constants when it starts: a record measured on this hardware (the
user's own first, then one shipped with the environment), else the tier's default constants,
with the choice written down in the constants' `source`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from openrebench.api import CalibrationRecord, Environment, NormConstants, Stats
from openrebench.base import OpenRebenchError, cache_dir

from ._hardware import Hardware, detect_hardware, model_key


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def record_filename(tier: str, hardware_key: str, models: Mapping[str, str] | None = None) -> str:
    with_models = "".join(f"--{_slug(role)}-{_slug(model)}" for role, model in sorted((models or {}).items()))
    return f"{tier}--{_slug(hardware_key)}{with_models}.json"


def tier_models(env: Environment, tier: str, models: Mapping[str, str] | None = None) -> dict[str, str]:
    """The model per role a run of the tier calls: the tier's defaults, `models` applied ({} for tiers
    that declare none)."""
    spec = env.tier(tier)
    return {role: str((models or {}).get(role, r.model)) for role, r in spec.models.items()}


def user_calibration_dir(env_id: str) -> Path:
    """This user's records, found first: `openrebench calibrate` always writes one here."""
    return cache_dir() / "calibration" / env_id


def shipped_calibration_dir(env: Environment) -> Path:
    """The records the package ships with the environment (`openrebench calibrate --ship` writes them)."""
    return env.root / "calibration"


def normalised_key(hardware_key: str) -> str:
    """'cpu:Intel(R) Xeon(R) Processor @ 2.00GHz' and 'cpu:Intel Xeon' are one key (records written
    before keys were normalised keep their original key and file name)."""
    kind, _, model = hardware_key.partition(":")
    return f"{kind}:{model_key(model)}"


def find_record(env: Environment, tier: str, hardware_key: str, models: Mapping[str, str] | None = None
                ) -> tuple[CalibrationRecord, str] | None:
    """This hardware's record for the tier and its models (the tier's defaults unless `models` says
    otherwise): the user's own, else a shipped one; a record of an older major version of the
    environment does not count."""
    want = normalised_key(hardware_key)
    want_models = tier_models(env, tier, models)
    folders = (("local", user_calibration_dir(env.id)), ("shipped", shipped_calibration_dir(env)))
    for origin, folder in folders:
        exact = folder / record_filename(tier, want, want_models)
        for path in [exact, *sorted(p for p in folder.glob(f"{tier}--*.json") if p != exact)]:
            if not path.is_file():
                continue
            try:
                record = CalibrationRecord.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue  # a broken record is not this hardware's record
            if (record.tier == tier and normalised_key(record.hardware_key) == want
                    and record.models == want_models
                    and record.env_version.split(".")[0] == env.version.split(".")[0]):
                return record, origin
    return None


def tier_records(env: Environment, tier: str) -> Iterator[tuple[CalibrationRecord, str]]:
    """Every readable record of the tier with its origin: the user's own ("local"), then the shipped."""
    folders = (("local", user_calibration_dir(env.id)), ("shipped", shipped_calibration_dir(env)))
    for origin, folder in folders:
        for path in sorted(folder.glob(f"{tier}--*.json")):
            try:
                record = CalibrationRecord.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue  # a broken record is no record
            if record.tier == tier:
                yield record, origin


def find_machine_record(env: Environment, tier: str, fingerprint: str,
                        models: Mapping[str, str] | None = None) -> tuple[CalibrationRecord, str] | None:
    """A record of this very machine (`Hardware.fingerprint`) for the tier and its models: the user's
    own (a self-calibration's, or `openrebench calibrate`'s), else a shipped one."""
    want_models = tier_models(env, tier, models)
    major = env.version.split(".")[0]
    return next(((record, origin) for record, origin in tier_records(env, tier)
                 if record.fingerprint == fingerprint and record.models == want_models
                 and record.env_version.split(".")[0] == major), None)


_BOOTSTRAP: ContextVar[bool] = ContextVar("openrebench_calibration_bootstrap", default=False)
UNCALIBRATED = NormConstants(start=0.0, reference=1.0, source=(
    "none: the tier's first calibration is being measured (raw scores only; normalised scores of these "
    "throw-away runs mean nothing)"))


@contextlib.contextmanager
def bootstrapping() -> Iterator[None]:
    """Runs started inside may belong to a tier whose shipped record does not exist yet (a new tier's
    first `openrebench calibrate --ship`): they get UNCALIBRATED constants instead of an error."""
    token = _BOOTSTRAP.set(True)
    try:
        yield
    finally:
        _BOOTSTRAP.reset(token)


def constants_for(env: Environment, tier: str, hardware: Hardware | None = None,
                  models: Mapping[str, str] | None = None) -> NormConstants:
    """A run's constants: the record of this machine (for a machine-dependent tier: one of its very
    fingerprint first), else of this hardware model and the run's models (the user's, then a shipped
    one), else the tier's default, which the tier reads from its own shipped record (measured on its
    reference hardware with its default models)."""
    spec = env.tier(tier)
    hardware = hardware or detect_hardware()
    key = hardware.key(spec.device)
    found = find_machine_record(env, tier, hardware.fingerprint(spec.device), models) \
        if spec.machine_dependent else None
    found = found or find_record(env, tier, key, models)
    if found:
        return found[0].constants(found[1])
    if spec.calibration is not None and not spec.calibration.is_file():
        if _BOOTSTRAP.get():
            return UNCALIBRATED
        raise OpenRebenchError(
            f"{env.id} {tier} is not calibrated yet (no {spec.calibration.name} in its calibration/ folder): "
            f"measure and ship its record with `openrebench calibrate {env.id} --tier {tier} --ship`")
    default = spec.default_constants
    want, defaults = tier_models(env, tier, models), tier_models(env, tier)
    other = {role: m for role, m in want.items() if m != defaults[role]}
    if other:
        named = ", ".join(f"{role}={m}" for role, m in sorted(other.items()))
        flags = " ".join(f"--env-model {role}={m}" for role, m in sorted(other.items()))
        note = (f"measured with the tier's default models, not with {named}: run `openrebench calibrate "
                f"{env.id} --tier {tier} {flags}` for constants of its own")
    else:
        note = f"no calibration for {key}: tier default"
    return default.model_copy(update={"source": f"{default.source} ({note})"})


ProgressFn = Callable[[str, int, float | None, str], None]


def calibrate(env: Environment, tier: str, repeats: int, *,
              score_once: Callable[[str], tuple[float | None, str]], command: str,
              on_progress: ProgressFn | None = None, models: Mapping[str, str] | None = None,
              probes: Sequence[str] = (), probe_repeats: int = 1) -> CalibrationRecord:
    """Score the starting and the reference solutions `repeats` times each (with `models`, for tiers
    that declare models: the tier's defaults unless it says otherwise), then each of `probes` (see
    `Environment.probes`) `probe_repeats` times; a probe always invalid is recorded as such, not fatal.

    `score_once(which)` returns (raw score or None, message), `which` being "start", "reference" or
    "probe:NAME"; `on_progress(which, i, raw, message)`.
    """
    from openrebench import __version__

    values: dict[str, list[float]] = {"start": [], "reference": []}
    invalid = {"start": 0, "reference": 0}
    for which in ("start", "reference"):
        for i in range(repeats):
            raw, message = score_once(which)
            if raw is None:
                invalid[which] += 1
            else:
                values[which].append(raw)
            if on_progress:
                on_progress(which, i + 1, raw, message)
        if not values[which]:
            raise OpenRebenchError(f"every scoring of the {which} solution was invalid on this machine")
    probed: dict[str, Stats] = {}
    for name in probes:
        got: list[float] = []
        for i in range(probe_repeats):
            raw, message = score_once(f"probe:{name}")
            if raw is None:
                invalid[f"probe:{name}"] = invalid.get(f"probe:{name}", 0) + 1
            else:
                got.append(raw)
            if on_progress:
                on_progress(f"probe:{name}", i + 1, raw, message)
        if got:
            probed[name] = Stats.of(got)
    hardware = detect_hardware()
    device = env.tier(tier).device
    return CalibrationRecord(
        env_id=env.id, env_version=env.version, tier=tier, hardware_key=hardware.key(device),
        hardware=hardware, fingerprint=hardware.fingerprint(device), start=Stats.of(values["start"]),
        reference=Stats.of(values["reference"]),
        probes=probed, invalid={k: v for k, v in invalid.items() if v}, models=tier_models(env, tier, models),
        measured_at=datetime.now(UTC), command=command,
        package_version=__version__,
    )


def record_of_scorings(env: Environment, tier: str, rows: Mapping[str, Sequence[Mapping[str, Any]]], *,
                       command: str, models: Mapping[str, str] | None = None) -> CalibrationRecord:
    """The record that scorings made elsewhere (a benchmark's rows, each with `raw` and `message`, under
    "start" and "reference") make, as `calibrate` would have made it from them."""
    repeats = len(rows["start"])
    if len(rows["reference"]) != repeats:
        raise ValueError(f"{repeats} start scorings but {len(rows['reference'])} of the reference")
    queues = {which: iter(rows[which]) for which in ("start", "reference")}

    def score_once(which: str) -> tuple[float | None, str]:
        row = next(queues[which])
        return row["raw"], str(row["message"])

    return calibrate(env, tier, repeats, score_once=score_once, command=command, models=models)


def save_record(record: CalibrationRecord, folder: Path, name: str | None = None) -> Path:
    """Write the record (whole or not at all: a reader never sees half of one), as `name` (default: the
    name its tier, hardware and models give it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or record_filename(record.tier, record.hardware_key, record.models))
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(record.model_dump_json(indent=2) + "\n")
    part.replace(path)
    return path
