"""The environment protocol: metadata, tiers and the hooks every environment implements."""

from __future__ import annotations

import string
from abc import ABC
from collections.abc import Collection, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openrebench.base import OpenRebenchError, load_object

from ._calibration import NormConstants, read_shipped_record
from ._files import SKIPPED_DIRS, Placement, RunFiles


def describe_duration(seconds: float) -> str:
    """A working time as the agent reads it: minutes under two hours ("30 minutes"), else hours."""
    value, unit = (seconds / 60, "minute") if seconds < 7200 else (seconds / 3600, "hour")
    value = round(value, 1)
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


class Direction(StrEnum):
    """Which row of the score log counts: the lowest, the highest, or the last valid one."""

    MIN = "min"
    MAX = "max"
    LAST = "last"


class NoParams(BaseModel, frozen=True):
    """The parameters of a tier that needs none."""


LOCAL_MODEL = "local"
"""The model spec of the offline default model (Gemma 3 270M served on this machine): needs no key."""
LOCAL_MODEL_WORDS = "Gemma 3 270M, a small base model served offline as `local`"
"""The offline model as instructions name it where a tier's own words do not."""

# The Inspect task's own arguments: a role is overridden as `-T <role>=<model>`, so it cannot be named
# like one of them.
RESERVED_ROLE_NAMES = frozenset({"tier", "agent", "time_limit", "runs_dir", "isolation", "message_limit",
                                 "token_limit", "model", "models", "model_budget_usd", "model_budget_tokens",
                                 "resume"})


class ModelRole(BaseModel, frozen=True):
    """A model the environment's code calls (the agent's code while it works, or the scorer): reached
    in the sandbox through the harness's gateway, never with a key of its own.

    Users override `model` per run (`openrebench eval --env-model ROLE=MODEL`, `-T ROLE=MODEL`).
    """

    description: str = Field(description="What the model is for, in a few words (`openrebench info`).")
    model: str = Field(min_length=1, description=(
        f"The tier's default: '{LOCAL_MODEL}' (the offline Gemma 3 270M, no key needed) or an Inspect "
        "model name such as 'openai/gpt-4o-mini'."))
    label: str | None = Field(default=None, description=(
        "The default model in words, as the instructions name it (`$model_<role>`), e.g. "
        "'gpt-3.5-turbo-0125'; a run given another model is told that model's name instead."))

    def describe(self, model: str | None = None) -> str:
        """The model a run has in this role (default: the tier's) as the agent's instructions name it:
        the tier's words for its own default, else the model's name, so that an agent given
        `--env-model judge=openai/gpt-4o` is not told of the default."""
        model = self.model if model is None else model
        if model == self.model and self.label:
            return self.label
        return LOCAL_MODEL_WORDS if model == LOCAL_MODEL else model


class ModelBudget(BaseModel, frozen=True):
    """What a run may spend on its environment's models, in US$, tokens (input plus output) or both:
    enforced by the gateway (a request past it is refused with HTTP 429)."""

    usd: float | None = Field(default=None, gt=0)
    tokens: int | None = Field(default=None, gt=0)
    reply_tokens: int | None = Field(default=None, gt=0, description=(
        "The most completion tokens one reply (each choice) may have: a request asking more, or naming no "
        "max_tokens, is cut to it (its finish_reason then says length). For a small model served on a CPU, "
        "whose base model rarely stops by itself: it bounds what a scoring costs."))

    @model_validator(mode="after")
    def _some_limit(self) -> Self:
        if self.usd is None and self.tokens is None:
            raise ValueError("a model budget needs usd, tokens or both")
        return self

    def describe(self) -> str:
        """In words, for the instructions (`$model_budget`): '$500', '2,000,000 tokens', or both, and the
        cap on a reply where there is one."""
        usd = None if self.usd is None else f"${self.usd:,.2f}".removesuffix(".00")
        tokens = None if self.tokens is None else f"{self.tokens:,} tokens"
        text = f"{usd} or {tokens}, whichever runs out first" if usd and tokens else usd or tokens or ""
        if self.reply_tokens is not None:
            text += f" (each reply at most {self.reply_tokens:,} tokens: a longer one is cut there)"
        return text


P = TypeVar("P", bound=BaseModel)


class TierSpec(BaseModel, Generic[P]):
    """One size of an environment: the same task and scorer, different hardware and scale.

    `params` is the environment's own pydantic model (frozen, one documented field per setting), so its
    scorer and asset builder read typed attributes. The default constants come from the calibration
    record shipped for the tier (`calibration`); only a tier whose constants cannot be measured by
    `openrebench calibrate` gives them by hand (`constants`), with a comment saying why.
    """

    model_config = ConfigDict(extra="forbid")

    name: Literal["mini", "full"]
    description: str
    device: Literal["cpu", "cuda"]
    hardware: str = Field(description="What the tier needs, in words.")
    time_limit_hours: float = Field(description="Default working-time budget for an attempt.")
    score_timeout_s: float = Field(description="Wall-clock limit of one scoring, set-up included.")
    memory_limit_gb: float = Field(description="Resident memory limit of the scoring processes.")
    machine_dependent: bool = Field(default=False, description=(
        "The raw score depends on the machine more than its model name says (timings; models trained on "
        "the machine): a run on a machine whose fingerprint (`Hardware.fingerprint`) no record has first "
        "calibrates the tier there (`openrebench.runs.calibrate_machine`), before the attempt's clock."))
    triton_cache: bool = Field(default=False, description=(
        "Keep Triton's compile cache across the run's scorings (one per run, out of the agent's sandbox, at "
        "most 256 MB, copied in and out like a snapshot): the solution's kernels compile in its first "
        "scoring only. For tiers whose scorings hold no held-out data the solution could carry on."))
    max_workspace_gb: float = Field(default=4, gt=0, description=(
        "The largest workspace a scoring copies (its snapshot): a bigger one scores invalid."))
    disk_gb: float | None = Field(default=None, gt=0, description=(
        "The attempt's disk of its own, where the harness can make one (root, loop devices): the "
        "workspace, home, /tmp, /opt and /var/tmp together, a write past it failing with ENOSPC (None: "
        "four times max_workspace_gb)."))

    @property
    def attempt_disk_bytes(self) -> int:
        return int((self.disk_gb or 4 * self.max_workspace_gb) * 1024**3)
    gpus: int = Field(default=0, description="GPUs an attempt holds exclusively (0: one if device is "
                                             "cuda, else none).")
    params: P = Field(default_factory=NoParams,  # type: ignore[assignment] - a tier may need none
                      description="The tier's settings: read by the scorer and the asset builder, and "
                                  "substituted into instructions.md.")
    calibration: Path | None = Field(default=None, description=(
        "The shipped calibration record (in the environment's calibration/ folder) that gives the default "
        "constants: the measurement on the tier's reference hardware."))
    constants: NormConstants | None = Field(default=None, description=(
        "Default constants given by hand, only where no record can be shipped (say why)."))
    paper_constants: NormConstants | None = None
    models: dict[str, ModelRole] = Field(default_factory=dict, description=(
        "The models the environment's code calls, by role (`judge`, `task_model`), each with the tier's "
        "default model. A run is granted these roles and no others."))
    model_budget: ModelBudget | None = Field(default=None, description=(
        "The default budget of the agent's calls to those models over its attempt (None: unlimited)."))
    scoring_model_budget: ModelBudget | None = Field(default=None, description=(
        "The budget of each scoring's calls, apart from the agent's, so that the agent's spending cannot "
        "leave a scoring without models (None: each scoring gets the limits of the run's budget)."))

    @model_validator(mode="after")
    def _role_names(self) -> Self:
        for role in self.models:
            if not role.isidentifier() or role.startswith("_") or role in RESERVED_ROLE_NAMES:
                raise ValueError(f"model role {role!r}: a role is a Python identifier, not starting with "
                                 f"'_' and none of {', '.join(sorted(RESERVED_ROLE_NAMES))}")
        if (self.model_budget is not None or self.scoring_model_budget is not None) and not self.models:
            raise ValueError("a model budget needs models (declare them in models=)")
        return self

    @model_validator(mode="after")
    def _one_source_of_constants(self) -> Self:
        if (self.calibration is None) == (self.constants is None):
            raise ValueError(f"the {self.name} tier must name either its shipped calibration record "
                             "(calibration=) or, where nothing can be measured, its constants (constants=)")
        return self

    @property
    def gpu_count(self) -> int:
        return self.gpus or (1 if self.device == "cuda" else 0)

    def own_models(self, models: Mapping[str, str] | None) -> bool:
        """Whether `models` (role: model; None: the tier's) are the tier's own, which its caps on a reply
        (`ModelBudget.reply_tokens`) are for: a run given others is not cut to what suits a small CPU
        model."""
        return models is None or all(models.get(role) == r.model for role, r in self.models.items())

    def scoring_budget(self, models: Mapping[str, str] | None) -> ModelBudget | None:
        """Each scoring's budget for a run of `models`: the tier's, without its reply cap where the models
        are not the tier's own (`own_models`)."""
        budget = self.scoring_model_budget
        if budget is not None and not self.own_models(models):
            budget = budget.model_copy(update={"reply_tokens": None})
        return budget

    @property
    def default_constants(self) -> NormConstants:
        """The constants of a machine that has no calibration record of its own. The shipped record is read
        when first asked for (never at import: sandboxes mask calibration/), then kept."""
        if self.calibration is None:
            assert self.constants is not None  # the validator's promise
            return self.constants
        record = read_shipped_record(self.calibration)
        if record.tier != self.name:
            raise OpenRebenchError(f"the shipped calibration record {self.calibration} is of the "
                                   f"{record.tier} tier, not {self.name}")
        return NormConstants(start=record.start.median, reference=record.reference.median,
                             source=f"shipped record {self.calibration.name} ({record.env_id} "
                                    f"{record.env_version}): {record.summary()}")


class ScoreResult(BaseModel):
    """What a scorer returns: a raw score (None when invalid), a message for the agent, hidden details."""

    raw: float | None
    message: str
    details: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def invalid(cls, message: str, **details: Any) -> ScoreResult:
        return cls(raw=None, message=message, details=details)


class ShippedData(BaseModel):
    """What `Environment.build_shipped` wrote, and what the person who built it should read."""

    files: list[Path] = Field(description="The files written, each under the out_dir the hook was given.")
    lines: list[str] = Field(default_factory=list, description="What was computed and anything to check, "
                                                               "one finding a line.")
    summary: dict[str, Any] = Field(default_factory=dict, description="The findings as JSON-able data, for "
                                                                     "benchmarks to record.")


class ModelAccess(Protocol):
    """How a process of the harness reaches a run's models (the gateway), for hooks that start one: put
    `prefix` before its command and `env` into its environment (it then finds OPENAI_BASE_URL and
    OPENAI_API_KEY set); `models` names each role's model (role: model spec)."""

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def prefix(self) -> tuple[str, ...]: ...

    @property
    def models(self) -> Mapping[str, str]: ...


class Environment(ABC, Generic[P]):
    """One RE-Bench environment: a small class plus the files in its folder.

    The folder holds `instructions.md` (a `string.Template` filled from the tier's params and what the
    run has: `$time_limit`, and where the tier declares models `$model_<role>`, `$model_budget` and
    `$scoring_model_budget`),
    `starting/` (the starting solution), `reference/` (the hidden reference solution, masked in
    every sandbox) and `calibration/` (the records the tiers' default constants come from, masked too).
    `P` is the model of the tiers' params: `class MyEnv(Environment[MyParams])` makes
    `self.tier(name).params` a `MyParams`.

    A run's life, and the hook called at each step (the tier is always given, never guessed):

    1. set-up, in the harness process (`openrebench start`, an eval's sample, calibration, the demo):
       `build_assets`, then `files` (placed by the runs layer), then `write_run_files`;
    2. each scoring, in the scorer process (a fresh, sandboxed process that sees only a snapshot of
       the workspace and the protected folder): `score`;
    3. where the reference solution is wanted (demo, calibration, the oracle agent, tests): `files`
       again, whose `reference` list the runs layer (`runs.install_reference`), or the oracle agent
       through the sandbox, writes over the workspace.

    No hook ever puts scorer-only data into the workspace: the runs layer refuses a set-up whose
    workspace holds a protected file's bytes (unless that entry is declared `public`).
    """

    id: ClassVar[str]
    rebench_id: ClassVar[str]
    title: ClassVar[str]
    version: ClassVar[str]
    direction: ClassVar[Direction]
    score_visible: ClassVar[bool] = True
    # True where the score is a time: the harness freezes the agent's own processes while it scores, so
    # that they neither slow the solution nor the scorer's yardstick runs.
    timing_sensitive: ClassVar[bool] = False
    # The scoring function, `module:function` (a leading dot: relative to this class's package), called
    # as function(spec, solution, protected) in the scorer process by the default `score`; imported only
    # there, so that a scorer's heavy imports stay out of the harness.
    scorer: ClassVar[str | None] = None
    # Each subclass narrows this to dict[str, TierSpec[ItsParams]] (a ClassVar cannot name P itself).
    tiers: ClassVar[dict[str, TierSpec[Any]]]

    @property
    def root(self) -> Path:
        import inspect

        return Path(inspect.getfile(type(self))).parent

    def tier(self, name: str) -> TierSpec[P]:
        try:
            return self.tiers[name]
        except KeyError:
            known = ", ".join(self.tiers)
            raise OpenRebenchError(f"unknown tier '{name}' for {self.id} (known: {known})") from None

    def instructions(self, tier: str, time_limit_s: float | None = None,
                     models: Mapping[str, str] | None = None, budget: ModelBudget | None = None) -> str:
        """The agent's instructions, with what its run really has: `time_limit_s` the working time
        (default: the tier's), told as `$time_limit` ("30 minutes", "8 hours"); where the tier declares
        models, `models` (role: model spec) the run's model of each role and `budget` its budget for
        them (default: the tier's), told as `$model_<role>` and `$model_budget`, and each scoring's budget
        as `$scoring_model_budget`."""
        spec = self.tier(tier)
        seconds = spec.time_limit_hours * 3600 if time_limit_s is None else time_limit_s
        text = (self.root / "instructions.md").read_text()
        values = {"tier": spec.name, "device": spec.device, "hardware": spec.hardware,
                  "time_limit": describe_duration(seconds), "time_limit_hours": f"{seconds / 3600:g}",
                  **spec.params.model_dump()}
        if spec.models:
            given_models = models or {}
            values |= {f"model_{role}": r.describe(given_models.get(role)) for role, r in spec.models.items()}
            given = budget or spec.model_budget
            values["model_budget"] = given.describe() if given else "no set limit"
            scoring = spec.scoring_budget(models)
            values["scoring_model_budget"] = scoring.describe() if scoring else "the run's budget"
        return string.Template(text).safe_substitute({k: str(v) for k, v in values.items()})

    def build_assets(self, tier: str, cache_dir: Path) -> None:  # an optional hook
        """Build (or find in `cache_dir`) every file that `files(tier, cache_dir)` names.

        Called in the harness process before each set-up, possibly by several processes at once. MUST
        be idempotent and cheap once built (a cached build is checked, not redone) and write only under
        `cache_dir`. MAY take long the first time: a build of more than a few seconds reports its steps
        with `openrebench.api.stage` (a cached one says nothing). Most environments need nothing.
        """

    @property
    def builds_with_models(self) -> bool:
        """Whether this environment implements `build_with_models`."""
        return type(self).build_with_models is not Environment.build_with_models

    def build_with_models(self, tier: str, cache_dir: Path, access: ModelAccess) -> None:  # optional
        """Build the assets that need the tier's models: a model trained against the tier's judge, say.

        Called in the harness process right after `build_assets`, at set-up (and wherever `files` is
        about to be asked for the files it builds), for tiers that declare `models`, with `access` to the
        run's models (granted for this call, with the scoring's budget). The same contract as
        `build_assets` (idempotent, cheap once built, writes only under `cache_dir`), and the cache MUST
        be keyed by the models it used (`access.models`), since other models give other assets. Code it
        runs that calls a model runs as a child process started through `access`.
        """

    def model_files(self, tier: str, cache_dir: Path, models: Mapping[str, str]) -> RunFiles:  # optional
        """The files `build_with_models` built for `models` (role: model spec, the run's), placed after
        `files`' own: what the run gets that depends on its models (a starting model trained against its
        judge, the reference trained against it). Called wherever `files` is, with the run's models;
        raises OpenRebenchError where they are not built. The default: none."""
        self.tier(tier)
        return RunFiles()

    def probes(self, tier: str, cache_dir: Path) -> dict[str, list[Placement]]:  # an optional hook
        """Degenerate solutions that `openrebench calibrate` scores beside the start and the reference:
        the environment's known ways to game its scorer without doing the task (chat_rl: models that
        answer every question the same way). Name: the files that make it, written over a run's
        workspace after its own. A probe scoring near or above the start says the scorer can be gamed;
        the record keeps them so that anyone can see it. May build (and cache) what it needs. The
        default: none."""
        self.tier(tier)
        return {}

    @property
    def builds_shipped_data(self) -> bool:
        """Whether this environment implements `build_shipped` (`openrebench build` refuses it otherwise)."""
        return type(self).build_shipped is not Environment.build_shipped

    def build_shipped(self, tier: str, out_dir: Path, cache_dir: Path, *, command: str) -> ShippedData:
        """Compute data the environment ships for `tier` that nobody writes by hand (scaling_law's ground
        truth, a sweep of training runs) into `out_dir`, laid out as the environment's own folder
        (`out_dir/reference/x.json` ships as `reference/x.json`). Optional: most environments ship only
        hand-written files and calibration records, which `openrebench calibrate ENV --ship` writes.

        When: from `openrebench build ENV --tier T` (with `--ship`, `out_dir` is `self.root`) on the tier's
        hardware, and from benchmarks that time it (into a throw-away folder); never while a run is set up
        or scored, which only read what was shipped.

        MUST: write only under `out_dir` and the asset cache `cache_dir`; be resumable, since a build may
        take hours (cache each expensive step in `cache_dir`, as `build_assets` does); replace each file
        whole once its content is computed, so that an interruption leaves a shipped file as it was; record
        `command` (what asked for the build) and the machine in what it writes; return the files written.

        MAY: report its steps with `openrebench.api.stage`; leave a file unchanged when the new result
        equals it (it keeps the record of the run that made it); check the result (for example score the
        starting and reference solutions against it) and report that in `lines` and `summary`.
        """
        raise OpenRebenchError(f"{self.id} ships no built data (it does not implement "
                               "Environment.build_shipped)")

    def host_tools(self, tier: str) -> list[Path]:  # an optional hook
        """Folders of host toolchains the environment's code runs besides Python (a compiler's sysroot):
        bound read-only at their own paths into the agent's and the scorer's sandboxes, each one's
        `bin/` put first on their PATH. Called in the harness process when a sandbox is made; raises
        OpenRebenchError naming what to install where a tool is missing. Most environments need none."""
        self.tier(tier)
        return []

    def files(self, tier: str, cache_dir: Path) -> RunFiles:
        """The tier's files: where its workspace, protected and reference files come from and go.

        Called in the harness process after `build_assets(tier, cache_dir)`, at set-up and wherever the
        reference solution is put in place, so possibly many times. MUST depend only on the tier and
        the built assets (the same lists for every run: per-run files come from `write_run_files`) and
        write nothing outside the cache; MAY call the cached builders to find their folders. MUST NOT
        list scorer-only data under `workspace` (a protected entry the agent also gets on purpose is
        declared `public`). The default: `starting/` as the workspace, `reference/` as the reference,
        nothing protected.
        """
        self.tier(tier)
        return RunFiles(workspace=self.folder_files("starting"), reference=self.folder_files("reference"))

    def write_run_files(self, tier: str, workspace: Path, protected: Path,  # an optional hook
                        cache_dir: Path) -> None:
        """Write the files that differ from one run to the next (a secret drawn per run).

        Called once per new run, in the harness process, after the declared workspace and protected
        files are in place and before the protected files are recorded. MUST write only inside
        `workspace` and `protected`, and never scorer-only data into `workspace`; MAY read the built
        assets. Whatever can be declared in `files` belongs there instead. Most environments need
        nothing.
        """

    def folder_files(self, folder: str, *, exclude: Collection[str] = (), under: str = "") -> list[Placement]:
        """The files of one of the environment's folders (`starting`, `reference`) at the same relative
        paths (below `under` where given), but those named in `exclude` and `__pycache__`."""
        root = self.root / folder
        if not root.is_dir():
            return []
        found = [(f, f.relative_to(root)) for f in sorted(root.rglob("*")) if f.is_file()]
        return [Placement.copy(f, f"{under}/{rel.as_posix()}" if under else rel.as_posix())
                for f, rel in found if not SKIPPED_DIRS & set(rel.parts) and rel.as_posix() not in exclude]

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        """Score a snapshot of the solution: by default the function `scorer` names, called with the
        tier's spec (a class with a scorer of another shape overrides this method instead).

        Called in the scorer process (never in the harness), once per scoring, with `solution` a
        writable snapshot of the workspace and `protected` the run's protected folder (read-only in
        the scoring sandbox). MUST treat everything in `solution` as hostile: run its code only in a
        separate process (`SolutionProcess`, or a limited child process), never import it here. MUST
        NOT write to `protected` or tell its contents in the message. SHOULD give a broken solution an
        invalid result with a one-line reason (an exception that escapes becomes a generic "internal
        error" row).
        """
        if self.scorer is None:
            raise NotImplementedError(f"{type(self).__name__} names no `scorer` and does not override score")
        function = load_object(self.scorer, type(self).__module__.rpartition(".")[0])
        return function(self.tier(tier), solution, protected)  # type: ignore[operator]
