"""What every environment shares: the protocol, runs, score logs, scoring, normalisation, calibration,
progress reports of long work."""

from ._bwrap import SANDBOX_UID, Bind, Limits, SandboxSpec, bwrap_binary, bwrap_command, bwrap_usable
from ._calibration import CalibrationRecord, Stats, calibrate, constants_for, find_record, save_record
from ._cgroup import Cgroup
from ._environment import Direction, Environment, NormConstants, ScoreResult, TierSpec, describe_duration
from ._errors import OpenRebenchError
from ._gpus import GpuLease, visible_gpus
from ._guard import TamperGuard
from ._hardware import Hardware, detect_hardware
from ._normalise import final_row, final_score, normalise
from ._paths import cache_dir
from ._progress import StageUpdate, progress_display, reporting, show_progress, stage
from ._protocol import HostChannel, SolutionError, SolutionProcess
from ._run import Run, RunInfo
from ._score_log import ScoreRow, append_row, read_log
from ._scoring import calibrate_environment, run_scorer, score_run, snapshot_workspace, start_run

__all__ = [
    "SANDBOX_UID",
    "Bind",
    "CalibrationRecord",
    "Cgroup",
    "Direction",
    "Environment",
    "GpuLease",
    "Hardware",
    "HostChannel",
    "Limits",
    "NormConstants",
    "OpenRebenchError",
    "Run",
    "RunInfo",
    "SandboxSpec",
    "ScoreResult",
    "ScoreRow",
    "SolutionError",
    "SolutionProcess",
    "StageUpdate",
    "Stats",
    "TamperGuard",
    "TierSpec",
    "append_row",
    "bwrap_binary",
    "bwrap_command",
    "bwrap_usable",
    "cache_dir",
    "calibrate",
    "calibrate_environment",
    "constants_for",
    "describe_duration",
    "detect_hardware",
    "final_row",
    "final_score",
    "find_record",
    "normalise",
    "progress_display",
    "read_log",
    "reporting",
    "run_scorer",
    "save_record",
    "score_run",
    "show_progress",
    "snapshot_workspace",
    "stage",
    "start_run",
    "visible_gpus",
]
