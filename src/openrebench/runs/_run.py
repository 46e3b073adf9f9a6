"""A run directory: workspace/ (the agent's), protected/ (the scorer's), score_log.jsonl, run.json."""

from __future__ import annotations

import functools
import json
import secrets
import shlex
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from openrebench.api import Environment, NormConstants
from openrebench.base import OpenRebenchError

from ._hardware import Hardware, detect_hardware, tier_hardware_problem
from ._score_log import ScoreRow, make_reserve, read_log

# A minute at least: set-up and the first scoring are not charged, but an attempt shorter than one
# scoring measures nothing. A week at most: beyond that the number is a typo (1e9h), not a budget.
TIME_LIMIT_RANGE_S = (60.0, 7 * 24 * 3600.0)
TIME_LIMIT_RANGE = "1 minute to 7 days (60 to 604800 seconds)"

RUN_FILE = "run.json"
LOG_FILE = "score_log.jsonl"


class RunInfo(BaseModel):
    """The run's fingerprint, written once at set-up."""

    env_id: str
    env_version: str
    tier: str
    seed: int
    created_at: datetime
    package_version: str
    hardware: Hardware
    constants: NormConstants
    started_at: datetime | None = None
    models: dict[str, str] = {}  # role: model spec, for tiers that declare models (defaults resolved)


def check_new_run_dir(path: Path) -> None:
    """A run goes where nothing is yet (or an empty folder): never over another run or other files."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OpenRebenchError(f"{parent} is a file, not a directory: a run cannot go under it")
            break
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        what = "a run" if (path / RUN_FILE).is_file() else "not an empty directory"
        raise OpenRebenchError(f"{path} already exists and is {what}: choose a new directory, or remove "
                               f"this one first (rm -r {shlex.quote(str(path))})")


class Run:
    """A run on disk, carrying its environment (`env`): given where the caller holds it already, else
    found by id in the registry once."""

    def __init__(self, path: Path, info: RunInfo, env: Environment | None = None) -> None:
        self.path = path
        self.info = info
        if env is not None:
            if env.id != info.env_id:
                raise ValueError(f"the environment {env.id!r} is not the run's ({info.env_id!r})")
            self.__dict__["env"] = env  # the cached property's value: no registry lookup

    workspace = property(lambda self: self.path / "workspace")
    protected = property(lambda self: self.path / "protected")
    score_log_path = property(lambda self: self.path / LOG_FILE)

    @classmethod
    def create(cls, env: Environment, tier: str, path: Path, *, seed: int | None = None,
               models: Mapping[str, str] | None = None) -> Run:
        """Make the directory layout and fingerprint at `path`, made absolute here once: scorers and
        sandboxes run in other working directories (the caller fills the workspace). `models` (role:
        model, where they are not the tier's defaults) choose the calibration record."""
        from openrebench import __version__

        from ._calibration import constants_for, tier_models

        spec = env.tier(tier)
        path = Path(path).expanduser().absolute()
        check_new_run_dir(path)
        hardware = detect_hardware()
        if problem := tier_hardware_problem(spec, hardware):
            raise OpenRebenchError(f"{env.id}: {problem}")
        info = RunInfo(
            env_id=env.id, env_version=env.version, tier=tier,
            seed=secrets.randbits(31) if seed is None else seed, created_at=datetime.now(UTC),
            package_version=__version__, hardware=hardware,
            constants=constants_for(env, tier, hardware, models),
            models=tier_models(env, tier, models),
        )
        (path / "workspace").mkdir(parents=True)
        (path / "protected").mkdir()
        (path / LOG_FILE).touch()
        make_reserve(path / LOG_FILE)  # room for a row when the disk fills up
        (path / RUN_FILE).write_text(info.model_dump_json(indent=2) + "\n")
        return cls(path, info, env)

    @classmethod
    def open(cls, path: Path) -> Run:
        """Open the run at `path`, or at the nearest folder above it that is a run."""
        path = Path(path).resolve()
        if not path.exists():
            raise OpenRebenchError(f"{path} does not exist")
        for candidate in (path, *path.parents):
            if (candidate / RUN_FILE).is_file():
                try:
                    info = RunInfo.model_validate(json.loads((candidate / RUN_FILE).read_text()))
                except (ValueError, ValidationError) as e:
                    first = str(e).splitlines()[0]
                    raise OpenRebenchError(f"{candidate / RUN_FILE} is not a valid run file: {first}") \
                        from None
                return cls(candidate, info)
        raise OpenRebenchError(f"{path} is not an openrebench run (no {RUN_FILE} here or above)")

    @functools.cached_property
    def env(self) -> Environment:
        """The run's environment, one object for the run's life: a scoring, its row and what the agent is
        told of it all read this one, instead of each asking the registry for a new one by id."""
        from ._registry import get_environment

        return get_environment(self.info.env_id)

    def rows(self) -> tuple[list[ScoreRow], list[str]]:
        return read_log(self.score_log_path)

    def mark_started(self) -> None:
        """Start the agent's clock (after set-up and the initial scoring, which are not charged)."""
        self.info.started_at = datetime.now(UTC)
        tmp = self.path / f".{RUN_FILE}.tmp"
        tmp.write_text(self.info.model_dump_json(indent=2) + "\n")
        tmp.replace(self.path / RUN_FILE)

    def elapsed_s(self) -> float:
        """Working seconds since the clock started; 0 during set-up."""
        if self.info.started_at is None:
            return 0.0
        return (datetime.now(UTC) - self.info.started_at).total_seconds()

    def describe(self, row: ScoreRow, time_limit_s: float | None = None) -> str:
        """What the agent is told about a scoring: the message, the score where the environment
        shows it, and (for charged rows) the working time used and left."""
        env = self.env
        lines = [row.message]
        if env.score_visible and row.raw is not None:
            lines.append(f"raw score {row.raw:.4f}, normalised {row.normalised:.3f}")
        if row.charged:
            limit = time_limit_s or env.tier(self.info.tier).time_limit_hours * 3600
            left = max(0.0, limit - row.elapsed_s)
            lines.append(f"working time used: {row.elapsed_s / 60:.1f} min; left: {left / 60:.1f} min")
        return "\n".join(lines)
