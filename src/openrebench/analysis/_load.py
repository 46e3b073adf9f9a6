"""Read openrebench's Inspect logs into attempts; every problem is a one-line error or a listed warning.

Nothing is left out silently: a sample without a score stops the analysis unless the caller asks to
skip incomplete samples, and then each skipped sample is listed in the warnings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openrebench.api import NormConstants, OpenRebenchError
from openrebench.runs import TIME_LIMIT_RANGE, TIME_LIMIT_RANGE_S, ScoreMetadata, ScoreRow, paper_matched

from ._environments import registered_facts
from ._model import Attempt, Dataset, EnvFacts, ModelUse
from ._paper import RELEASE_ONLY_ENVIRONMENTS, by_rebench_id

SCORER = "rebench_scorer"
LEGACY_SCORERS = ("run_score",)  # the same scorer under its earlier name, in logs written before
GATEWAY_USAGE = "gateway_usage"
"""The score metadata key of the gateway's totals for a run: {"total": {...}, "roles": {role: {...}}}."""
LOG_SUFFIXES = (".eval", ".json")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _error_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0][:160] if lines else "no message"


def log_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files and directories (searched recursively) into Inspect log files, in a stable order."""
    from inspect_ai.log import list_eval_logs

    found: list[Path] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise OpenRebenchError(f"{path} does not exist")
        if path.is_file():
            if path.suffix not in LOG_SUFFIXES:
                raise OpenRebenchError(f"{path} is not an Inspect log (expected a .eval or .json file)")
            found.append(path.resolve())
            continue
        infos = list_eval_logs(str(path), recursive=True)
        in_dir = sorted(Path(info.name.removeprefix("file://")).resolve() for info in infos)
        if not in_dir:
            raise OpenRebenchError(f"{path}: no Inspect logs (.eval or .json) in this directory")
        found.extend(in_dir)
    unique = list(dict.fromkeys(found))
    return unique


def _group_label(agent: str, model: str, tier: str) -> str:
    """The agent and, where one was used, the model ("none" is Inspect's no-model model; mockllm is what
    older logs of the oracle recorded)."""
    if agent in ("oracle", "human") or model in ("none", "none/none") or model.startswith("mockllm/"):
        return f"{agent} ({tier})"
    return f"{agent} · {model} ({tier})"


def _time_limit_h(log: Any) -> float | str:
    """The run length in hours, or why the log gives none usable: missing, not a number, or outside
    the range `openrebench eval` and the tasks accept (a log edited by hand or from an older version)."""
    seconds = getattr(log.eval.config, "working_limit", None)
    if seconds is None:
        seconds = (log.eval.task_args or {}).get("time_limit")
    if seconds is None:
        return "the log records no working time limit (eval config working_limit), so the run's length " \
               "is unknown"
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        return f"its working time limit {seconds!r} is not a number of seconds"
    low, high = TIME_LIMIT_RANGE_S
    if not (math.isfinite(value) and low <= value <= high):
        return f"its working time limit ({value:g} s) is outside {TIME_LIMIT_RANGE}"
    return value / 3600


class _Prices:
    """Dollars for the agent's tokens: Inspect's own cost where the log has one, else `--prices`, else the
    gateway's price table (list prices, the offline model at 0), each model looked up once; which models
    were priced from the table is noted, as those prices may be stale."""

    def __init__(self, given: Mapping[str, Mapping[str, float]] | None) -> None:
        self.given = given
        self.found: dict[str, tuple[dict[str, float] | None, str]] = {}

    def price(self, model: str) -> dict[str, float] | None:
        if self.given and model in self.given:
            return dict(self.given[model])
        if model not in self.found:
            from openrebench.gateway import find_price

            self.found[model] = find_price(model)
        return self.found[model][0]

    def notes(self) -> list[str]:
        return [f"the agent's dollars for {model} are its tokens at {p['input']:g}/{p['output']:g} US$ per "
                f"1M input/output tokens ({source})" for model, (p, source) in sorted(self.found.items())
                if p is not None and source != "runs locally"]


def _usage(sample: Any, prices: _Prices) -> tuple[int, float | None]:
    """The agent's tokens and dollars, summed over the models it called."""
    usage = sample.model_usage or {}
    tokens = sum(int(u.total_tokens or 0) for u in usage.values())
    cost = 0.0
    for model, u in usage.items():
        if u.total_cost is not None:
            cost += float(u.total_cost)
        elif (p := prices.price(model)) is not None:
            cost += (u.input_tokens * p.get("input", 0.0) + u.output_tokens * p.get("output", 0.0)) / 1e6
        else:
            return tokens, None
    return tokens, cost


def _count(raw: Mapping[str, Any], *names: str) -> int | None:
    """The first of `names` present in `raw` as a count (absent: 0; not a count: None)."""
    value = next((raw[n] for n in names if n in raw), 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or not math.isfinite(value):
        return None
    return int(value)


def _model_use(raw: Any) -> ModelUse | None:
    """One block of the gateway's totals, spelt either way (input/output or prompt/completion tokens)."""
    if not isinstance(raw, Mapping):
        return None
    counts = {"requests": _count(raw, "requests"),
              "input_tokens": _count(raw, "input_tokens", "prompt_tokens"),
              "output_tokens": _count(raw, "output_tokens", "completion_tokens"),
              "failures": _count(raw, "failures")}
    cost = raw.get("cost_usd", 0.0)
    if any(v is None for v in counts.values()) or isinstance(cost, bool) \
            or not (cost is None or isinstance(cost, int | float)):
        return None
    if raw.get("priced") is False or cost is None or not math.isfinite(cost):
        cost = None  # a model without a price was used: the sum is a lower bound, shown as unknown
    return ModelUse(cost_usd=cost, **{k: v for k, v in counts.items() if v is not None})


def _env_models(meta: ScoreMetadata, where: str,
                warnings: list[str]) -> tuple[ModelUse | None, dict[str, ModelUse]]:
    """The gateway's totals for the run's environment models (`gateway_usage` in the score metadata);
    absent: the run used none. A malformed record is left out with a warning, never fatal."""
    raw = meta.gateway_usage
    if raw is None:
        return None, {}
    total = _model_use(raw.get("total")) if isinstance(raw, Mapping) else None
    if total is None:
        warnings.append(f"{where}: score metadata '{GATEWAY_USAGE}' has no readable total; the environment's "
                        "model usage is left out")
        return None, {}
    roles_raw = raw.get("roles") or {}
    roles = {str(k): u for k, v in roles_raw.items() if (u := _model_use(v)) is not None} \
        if isinstance(roles_raw, Mapping) else {}
    if not isinstance(roles_raw, Mapping) or len(roles) < len(roles_raw):
        warnings.append(f"{where}: some of '{GATEWAY_USAGE}' roles are unreadable; left out of the per-role "
                        "table")
    return total, roles


def _trajectory(rows: list[ScoreRow]) -> list[tuple[float, float | None]]:
    return [(r.elapsed_s / 3600, r.normalised if r.raw is not None else None)
            for r in rows if r.kind in ("setup", "score")]


def _paper_trajectory(rows: list[ScoreRow], measured: NormConstants | None,
                      paper: NormConstants | None) -> list[tuple[float, float | None]] | None:
    """The score log on the paper-matched scale: as the rows recorded it, else (rows written before they
    carried it) recomputed from their raw scores; None where neither can be had."""
    out: list[tuple[float, float | None]] = []
    for r in rows:
        if r.kind not in ("setup", "score"):
            continue
        value = r.normalised_paper
        if value is None and r.raw is not None:
            if measured is None or paper is None:
                return None
            value = paper_matched(r.raw, measured, paper)
        out.append((r.elapsed_s / 3600, value if r.raw is not None else None))
    return out


def _constants(raw: Any) -> NormConstants | None:
    try:
        return NormConstants.model_validate(raw) if isinstance(raw, Mapping) else None
    except ValidationError:
        return None


def _paper_score(meta: ScoreMetadata, measured: NormConstants | None,
                 paper: NormConstants | None) -> float | None:
    """The run's final paper-matched score: the scorer's (`normalised_paper`), else recomputed from the
    raw score (logs written before the scorer recorded it); a run without a valid score has 0."""
    if meta.normalised_paper is not None and math.isfinite(meta.normalised_paper):
        return meta.normalised_paper
    if meta.raw is None:
        return 0.0 if paper is not None else None
    if measured is None or paper is None:
        return None
    return paper_matched(meta.raw, measured, paper)


def _attempt(log: Any, sample: Any, where: str, length_h: float, prices: _Prices, warnings: list[str],
             rebench_ids: Mapping[str, EnvFacts], registered: Mapping[str, EnvFacts]) -> Attempt | str:
    """The sample as an attempt, or the reason it is incomplete (no score)."""
    scores = sample.scores or {}
    score = next((scores[name] for name in (SCORER, *LEGACY_SCORERS) if name in scores), None)
    if score is None:
        if sample.error is not None:
            return f"the sample failed ({_error_line(sample.error.message)})"
        return f"no '{SCORER}' score" + (f" (limit hit: {sample.limit.type})" if sample.limit else "")
    try:
        value = float(score.value)
    except (TypeError, ValueError):
        raise OpenRebenchError(f"{where}: score value {score.value!r} is not a number") from None
    if not math.isfinite(value):
        raise OpenRebenchError(f"{where}: score value {value} is not finite")
    meta = ScoreMetadata.read(score.metadata, where)
    for key in ("fingerprint", "score_log"):
        if key not in meta.model_fields_set:
            raise OpenRebenchError(f"{where}: score metadata lacks '{key}' (not written by openrebench's "
                                   f"{SCORER} scorer?)")
    fingerprint = meta.fingerprint or {}
    if not isinstance(fingerprint.get("hardware"), dict):
        raise OpenRebenchError(f"{where}: score metadata 'fingerprint' has no hardware record")
    gpus = fingerprint["hardware"].get("gpu_count") or 0
    if not isinstance(gpus, int) or gpus < 0:
        raise OpenRebenchError(f"{where}: the fingerprint's gpu_count {gpus!r} is not a count")
    rows: list[ScoreRow] = []
    for i, row in enumerate(meta.score_log):
        try:
            rows.append(ScoreRow.model_validate(row))
        except ValidationError as e:
            raise OpenRebenchError(f"{where}: score_log row {i} is malformed "
                                   f"({e.errors()[0]['loc']}: {e.errors()[0]['msg']})") from None
    for w in meta.log_warnings:
        warnings.append(f"{where}: {w}")
    task_meta = log.eval.metadata or {}
    env_id = (sample.metadata or {}).get("env_id") or task_meta["env_id"]
    if env_id in rebench_ids:  # a RE-Bench task id: ours, so that the paper's runs and ours meet
        env_id = rebench_ids[env_id].env_id
    if fingerprint.get("env_id") not in (None, env_id):
        raise OpenRebenchError(f"{where}: the sample is for {env_id} but its run fingerprint says "
                               f"{fingerprint.get('env_id')}")
    tier = (sample.metadata or {}).get("tier") or task_meta.get("tier") or fingerprint.get("tier") or "?"
    # A solver given to `inspect eval --solver` ran in place of the task's agent: Inspect names it in the log.
    agent = str(log.eval.solver or task_meta.get("agent", "unknown"))
    hours_used = (sample.working_time / 3600 if sample.working_time is not None
                  else max((r.elapsed_s for r in rows), default=0.0) / 3600)
    tokens, cost = _usage(sample, prices)
    env_models, env_roles = _env_models(meta, where, warnings)
    measured = _constants(fingerprint.get("constants"))
    facts = registered.get(env_id)
    paper = _constants(meta.paper_constants) or (facts.paper_constants if facts else None)
    trajectory = _trajectory(rows)
    scores: dict[str, float] = {"measured": value}
    trajectories = {"measured": trajectory}
    if (paper_score := _paper_score(meta, measured, paper)) is not None:
        scores["paper"] = paper_score
        if (paper_rows := _paper_trajectory(rows, measured, paper)) is not None:
            trajectories["paper"] = paper_rows
    return Attempt(
        group=_group_label(agent, str(log.eval.model), tier), is_human=agent == "human", env_id=env_id,
        tier=tier, length_h=length_h, score=value,
        raw=meta.raw,
        trajectory=trajectory, scores=scores, trajectories=trajectories,  # type: ignore[arg-type]
        constants=measured, paper_constants=paper if "paper" in scores else None, scaffold=agent,
        tokens=tokens, cost_usd=cost, env_models=env_models,
        env_roles=env_roles, gpu_hours=gpus * hours_used, hours_used=hours_used, source=f"{where}")


def _logged_facts(log: Any, path: Path) -> EnvFacts | None:
    """What a log says of its environment (recorded since the registry took over the analysis), so that
    the log of a plug-in no longer installed is still read as its environment was."""
    meta = log.eval.metadata or {}
    if "score_visible" not in meta:
        return None
    try:
        return EnvFacts(env_id=meta["env_id"], rebench_id=meta.get("rebench_id"),
                        score_visible=meta["score_visible"], direction=meta.get("direction"),
                        source=f"its log ({path.name})")
    except ValidationError:
        return None


def _environment_facts(data: Dataset, logged: Mapping[str, EnvFacts]) -> None:
    """Facts for every environment with attempts: the registered environment's own, else what its log
    recorded, else (for an id of the paper's release) the release's, else the defaults; each environment
    the registry does not know gets a note saying which."""
    registered = registered_facts()
    release = {f.env_id: f for f in RELEASE_ONLY_ENVIRONMENTS}
    for env in data.environments():
        if env in registered:
            data.env_facts[env] = registered[env]
            continue
        facts = logged.get(env) or release.get(env)
        if facts is None:
            facts = EnvFacts(env_id=env, source="defaults")
            how = ("its logs do not say whether the agent saw its score: taken as visible (best of k), with "
                   "a run's best score so far counting")
        else:
            seen = "visible" if facts.score_visible else "hidden"
            how = f"read as {facts.source} says (score {seen}, direction {facts.direction or 'unknown'})"
        data.env_facts[env] = facts
        data.notes.append(f"{env} is not a registered environment (a plug-in no longer installed?); {how}")


def _read(path: Path) -> Any:
    from inspect_ai.log import read_eval_log

    try:
        return read_eval_log(str(path))
    except Exception as e:  # Inspect raises many kinds for a bad file; all mean "not readable"
        raise OpenRebenchError(f"{path}: not a readable Inspect log ({_first_line(e)})") from None


def load_logs(paths: Sequence[Path], *, skip_incomplete: bool = False,
              prices: Mapping[str, Mapping[str, float]] | None = None) -> Dataset:
    """All openrebench samples in the given Inspect logs (files or directories)."""
    data = Dataset()
    pricing = _Prices(prices)
    seen: set[tuple[str, str, int]] = set()
    rebench_ids = by_rebench_id()
    registered = registered_facts()
    logged: dict[str, EnvFacts] = {}
    for path in log_files(paths):
        log = _read(path)
        data.sources.append(str(path))
        if "env_id" not in (log.eval.metadata or {}):
            raise OpenRebenchError(f"{path}: not an openrebench log (task '{log.eval.task}' has no env_id "
                                   "in its metadata)")
        if not log.samples:
            reason = f"status {log.status}" + (f": {_error_line(log.error.message)}" if log.error else "")
            if not skip_incomplete:
                raise OpenRebenchError(f"{path}: the log has no samples ({reason}); pass --skip-incomplete "
                                       "to leave it out")
            data.warnings.append(f"{path.name}: left out, no samples ({reason})")
            continue
        if (facts := _logged_facts(log, path)) is not None:
            logged.setdefault(facts.env_id, facts)
        length_h = _time_limit_h(log)
        if isinstance(length_h, str):
            if not skip_incomplete:
                raise OpenRebenchError(f"{path}: {length_h}; pass --skip-incomplete to leave it out")
            data.warnings.append(f"{path.name}: left out: {length_h}")
            continue
        if log.status != "success":
            data.warnings.append(f"{path.name}: eval status is '{log.status}'; its finished samples are used")
        for sample in log.samples:
            where = f"{path.name}#{sample.id}/epoch{sample.epoch}"
            key = (log.eval.eval_id, str(sample.id), int(sample.epoch))
            if key in seen:
                data.warnings.append(f"{where}: the same sample was given twice; counted once")
                continue
            seen.add(key)
            result = _attempt(log, sample, where, length_h, pricing, data.warnings, rebench_ids, registered)
            if isinstance(result, str):
                if not skip_incomplete:
                    raise OpenRebenchError(f"{where}: {result}; pass --skip-incomplete to leave such samples "
                                           "out")
                data.warnings.append(f"{where}: left out: {result}")
                continue
            data.attempts.append(result)
    _environment_facts(data, logged)
    data.notes.extend(pricing.notes())
    return data
