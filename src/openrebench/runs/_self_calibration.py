"""Machines that calibrate themselves: a machine-dependent tier (`TierSpec.machine_dependent`) whose
machine's fingerprint no record has is calibrated at a run's set-up, before its clock, and again where a
set-up scoring of the start shows the record no longer fits (`drifted`). See docs/runs.md."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from openrebench.api import Environment, stage

from ._calibration import (
    CalibrationRecord,
    find_machine_record,
    save_record,
    tier_records,
    user_calibration_dir,
)
from ._hardware import detect_hardware
from ._registry import get_environment
from ._scorer_process import ScoringAccessFn
from ._scoring import calibrate_environment

SELF_CALIBRATION_ENV = "OPENREBENCH_SELF_CALIBRATION"  # "0": never (the test suite, where a test asks)
SELF_CALIBRATION_REPEATS = 3
SELF_CALIBRATION_TRIES = 2
MIN_NOISE = 0.05  # the least spread (sd of raw scores) a self-calibration may show and be kept


def _noise_bound(env: Environment, tier: str) -> float:
    """The spread a self-calibration may show: twice the largest of the tier's shipped records (their
    start's or reference's sd), at least MIN_NOISE. A busy neighbour spreads the scorings beyond it."""
    sds = [MIN_NOISE / 2]
    for record, origin in tier_records(env, tier):
        if origin == "shipped":
            sds += [record.start.sd, record.reference.sd]
    return 2 * max(sds)


def _self_calibrating(spec: Any) -> bool:
    return bool(spec.machine_dependent) and os.environ.get(SELF_CALIBRATION_ENV) != "0"


def drifted(env: Environment, tier: str, raw: float | None, models: Mapping[str, str] | None) -> bool:
    """Whether a set-up scoring of the start (`raw`) falls outside this machine's record: further from its
    median than three of its standard deviations (at least 2 x MIN_NOISE). A machine whose record was
    made on other hardware behind the same fingerprint, or under another load, shows it here."""
    spec = env.tier(tier)
    if raw is None or not _self_calibrating(spec):
        return False
    found = find_machine_record(env, tier, detect_hardware().fingerprint(spec.device), models)
    if found is None:
        return False
    start = found[0].start
    return abs(raw - start.median) > max(3 * start.sd, 2 * MIN_NOISE)


def calibrate_machine(env: Environment | str, tier: str, *, models: Mapping[str, str] | None = None,
                      access: ScoringAccessFn | None = None, replace: bool = False
                      ) -> CalibrationRecord | None:
    """Calibrate a machine-dependent tier (`TierSpec.machine_dependent`) on this machine where no record
    has its fingerprint (or, with `replace`, where its record no longer fits: see `drifted`): the
    shipped start and reference, SELF_CALIBRATION_REPEATS scorings each, in throw-away runs; kept in the
    user's calibration folder, so it happens once per machine. Under a lock per environment, so two
    processes calibrate once between them. A record whose spread shows interference (beyond
    `_noise_bound`) is measured again, and never kept: the run then takes the constants it would have
    had. Returns the record made (None: none was needed or kept)."""
    env = get_environment(env)
    spec = env.tier(tier)
    if not _self_calibrating(spec):
        return None
    fingerprint = detect_hardware().fingerprint(spec.device)
    seen = find_machine_record(env, tier, fingerprint, models)
    if seen and not replace:
        return None
    import fcntl

    folder = user_calibration_dir(env.id)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process calibrating this environment: its record counts
        now = find_machine_record(env, tier, fingerprint, models)
        if now and (not replace or (seen and now[0].measured_at > seen[0].measured_at)):
            return None
        bound = _noise_bound(env, tier)
        n = SELF_CALIBRATION_REPEATS
        for attempt in range(1, SELF_CALIBRATION_TRIES + 1):
            again = f", try {attempt}" if attempt > 1 else ""  # the last was disturbed
            what = f"calibrating {env.id} {tier} for this machine (once{again})"
            with stage(what, total=2 * n) as progress:
                record = calibrate_environment(env, tier, n, access=access, models=models, probe_repeats=0,
                                               command=f"self-calibration at set-up ({n} scorings each)",
                                               on_progress=lambda *_: progress.advance())
            if max(record.start.sd, record.reference.sd) <= bound:
                save_record(record, folder)
                return record
        return None
