"""What an environment author writes against: the Environment class and its tiers (typed params, constants
from shipped calibration records), the files of a run, score results, the solution-process protocol, the
tamper guard, progress reports of long builds, the asset cache (`cached_build`: a folder built once,
with a manifest of checksums verified on reuse, resumable under a time budget), the models an
environment's code calls (`ModelRole`, `ModelBudget`).

The bottom layer: it imports nothing else of openrebench, so an environment (built in or a
third-party package) depends on this and on nothing that could change under it.
"""

from openrebench.base import OpenRebenchError, cache_dir

from ._assets import (
    AssetError,
    BuildIncomplete,
    Deadline,
    Manifest,
    OnMismatch,
    asset_key,
    assets_root,
    cached_build,
    load_manifest,
    sha256_file,
    verify,
)
from ._calibration import CalibrationRecord, Hardware, NormConstants, Stats, model_key
from ._environment import (
    LOCAL_MODEL,
    Direction,
    Environment,
    ModelAccess,
    ModelBudget,
    ModelRole,
    NoParams,
    ScoreResult,
    ShippedData,
    TierSpec,
    describe_duration,
)
from ._files import Placement, RunFiles, file_contents
from ._guard import TamperGuard
from ._progress import StageUpdate, progress_display, reporting, show_progress, stage
from ._protocol import (
    RUN_CGROUP_ENV,
    SOLUTION_UID_ENV,
    SOLUTION_USER,
    HostChannel,
    SolutionError,
    SolutionProcess,
    become_solution,
    solution_cgroup,
    solution_prefix,
    solution_uid,
)
from ._solution import import_solution, solution_traceback

__all__ = [
    "LOCAL_MODEL",
    "RUN_CGROUP_ENV",
    "SOLUTION_UID_ENV",
    "SOLUTION_USER",
    "AssetError",
    "BuildIncomplete",
    "CalibrationRecord",
    "Deadline",
    "Direction",
    "Environment",
    "Hardware",
    "HostChannel",
    "Manifest",
    "ModelAccess",
    "ModelBudget",
    "ModelRole",
    "NoParams",
    "NormConstants",
    "OnMismatch",
    "OpenRebenchError",
    "Placement",
    "RunFiles",
    "ScoreResult",
    "ShippedData",
    "SolutionError",
    "SolutionProcess",
    "StageUpdate",
    "Stats",
    "TamperGuard",
    "TierSpec",
    "asset_key",
    "assets_root",
    "become_solution",
    "cache_dir",
    "cached_build",
    "describe_duration",
    "file_contents",
    "import_solution",
    "load_manifest",
    "model_key",
    "progress_display",
    "reporting",
    "sha256_file",
    "show_progress",
    "solution_cgroup",
    "solution_prefix",
    "solution_traceback",
    "solution_uid",
    "stage",
    "verify",
]
