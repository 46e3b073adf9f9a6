"""What an attempt's score carries beside its value in Inspect's log: one typed definition, which the
harness writes (`harness.rebench_scorer`) and the CLI's results table, the analysis and the cluster's nodes
read, instead of each keeping its own copy of the key names.

Logs outlive versions: a field a log lacks reads as its default, and keys a later version adds pass
through untouched (`extra="allow"`). The run's fingerprint and rows stay JSON here: the analysis checks
them field by field with its own messages, and must read logs whose run schema was older.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openrebench.base import OpenRebenchError

_EXPECTED = {"raw": "is not a number", "normalised_paper": "is not a number", "run_dir": "is not a path",
             "fingerprint": "is not a record of the run", "isolation": "is not a name",
             "isolated": "is not true or false", "score_log": "is not a list of rows",
             "log_warnings": "is not a list of texts", "paper_constants": "is not a record of constants"}


class ScoreMetadata(BaseModel):
    """The run's final score's metadata (see `harness.rebench_scorer`)."""

    model_config = ConfigDict(extra="allow")

    raw: float | None = Field(default=None, description="The final row's raw score (None: no valid row).")
    run_dir: str | None = Field(default=None, description="The run's directory.")
    fingerprint: dict[str, Any] | None = Field(default=None, description=(
        "The run's `run.json` (RunInfo as JSON): environment, tier, hardware, constants, models."))
    isolation: str | None = Field(default=None, description="The attempt's sandbox backend.")
    isolated: bool | None = Field(default=None, description=(
        "Whether that backend isolates (False: --isolation none, a score that measures nothing)."))
    score_log: list[dict[str, Any]] = Field(default_factory=list, description="Every row, as JSON.")
    log_warnings: list[str] = Field(default_factory=list, description="What reading the log skipped.")
    normalised_paper: float | None = Field(default=None, description=(
        "The final score normalised with the paper's constants (where the tier has them)."))
    paper_constants: dict[str, Any] | None = Field(default=None, description="Those constants, as JSON.")
    # Read loosely: the analysis leaves a malformed record out with a warning instead of refusing the log.
    gateway_usage: Any = Field(default=None, description=(
        "The environment's own models' use through the gateway: totals overall and by role."))

    @classmethod
    def read(cls, metadata: Mapping[str, Any] | None, where: str = "a score") -> ScoreMetadata:
        """The metadata of a score in a log, or one line naming the field that is not what it should be."""
        try:
            return cls.model_validate(dict(metadata or {}))
        except ValidationError as e:
            field = str(e.errors()[0]["loc"][0])
            raise OpenRebenchError(f"{where}: score metadata '{field}' {_EXPECTED.get(field, 'is malformed')}"
                                   ) from None

    def written(self) -> dict[str, Any]:
        """As the harness writes it into the log: the fields it set, as JSON."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def constants_source(self) -> str | None:
        """Where the run's normalisation constants came from (a shipped record, this machine's...)."""
        constants = (self.fingerprint or {}).get("constants")
        source = constants.get("source") if isinstance(constants, dict) else None
        return str(source) if source else None
