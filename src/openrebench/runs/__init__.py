"""Runs: the run directory, the placing of an environment's declared files, the score log, scoring in
a separate limited process, normalisation, calibration and the registry of environments. Functions
here take Environment objects or resolve ids through the registry; nothing imports an environment by
name."""

from ._calibration import (
    CalibrationRecord,
    Stats,
    calibrate,
    constants_for,
    find_machine_record,
    find_record,
    save_record,
    shipped_calibration_dir,
    tier_models,
    user_calibration_dir,
)
from ._files import install_reference, place, protected_leaks, run_files
from ._hardware import Hardware, detect_hardware, tier_hardware_problem
from ._normalise import final_row, final_score, normalise, paper_constants, paper_matched
from ._registry import ENTRY_POINT_GROUP, environment_classes, environment_ids, get_environment, refresh
from ._run import TIME_LIMIT_RANGE, TIME_LIMIT_RANGE_S, Run, RunInfo
from ._score_log import ScoreRow, append_row, read_log
from ._score_metadata import ScoreMetadata
from ._scorer_process import ScoringAccess, ScoringAccessFn, score_solution
from ._scoring import calibrate_environment, score_run, start_run
from ._self_calibration import calibrate_machine
from ._snapshot import snapshot_workspace

__all__ = [
    "ENTRY_POINT_GROUP",
    "TIME_LIMIT_RANGE",
    "TIME_LIMIT_RANGE_S",
    "CalibrationRecord",
    "Hardware",
    "Run",
    "RunInfo",
    "ScoreMetadata",
    "ScoreRow",
    "ScoringAccess",
    "ScoringAccessFn",
    "Stats",
    "append_row",
    "calibrate",
    "calibrate_environment",
    "calibrate_machine",
    "constants_for",
    "detect_hardware",
    "environment_classes",
    "environment_ids",
    "final_row",
    "final_score",
    "find_machine_record",
    "find_record",
    "get_environment",
    "install_reference",
    "normalise",
    "paper_constants",
    "paper_matched",
    "place",
    "protected_leaks",
    "read_log",
    "refresh",
    "run_files",
    "save_record",
    "score_run",
    "score_solution",
    "shipped_calibration_dir",
    "snapshot_workspace",
    "start_run",
    "tier_hardware_problem",
    "tier_models",
    "user_calibration_dir",
]
