"""A run's models: the roles its tier declares, the models the user chose for them, and its grants on
the process's gateway (one for the agent's attempt, one per scoring).

The tier names each role's default model and the default budget; task arguments override them
(`-T judge=openai/gpt-4o`, `-T model_budget_usd=2`). What the run was given is written to
`<run>/gateway/grant.json` (never the token), beside the usage log the gateway writes,
`<run>/gateway/usage.jsonl`: one row per request, each naming its role and its phase (`agent` or
`scoring`). The agent's attempt and each scoring have budgets of their own (the gateway counts each
grant's rows apart): the agent's spending cannot leave the scorer without models, nor one scoring the
next. A scoring's budget is the tier's `scoring_model_budget`, or the run's limits where it has none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openrebench.api import LOCAL_MODEL, Environment, OpenRebenchError
from openrebench.gateway import (
    SOCKET_NAME,
    USAGE_LOG,
    Budget,
    Grant,
    ModelService,
    exec_prefix,
    find_price,
    model_service,
    summarise,
)
from openrebench.isolation import Bind
from openrebench.runs import Run, ScoringAccess

from ._layout import GATEWAY_DIR, GATEWAY_PORT

GRANT_FILE = Path("gateway") / "grant.json"
AGENT, SCORING, BUILD = "agent", "scoring", "build"


def declared_roles(env: Environment | type[Environment]) -> dict[str, list[str]]:
    """Every role any tier of `env` declares, with the tiers that declare it."""
    roles: dict[str, list[str]] = {}
    for spec in env.tiers.values():
        for role in spec.models:
            roles.setdefault(role, []).append(spec.name)
    return roles


def resolve_models(env: Environment, tier: str, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The run's model per role: the tier's defaults, with `overrides` (role: model spec) applied; a
    role the tier does not declare, or an empty model, is a one-line error."""
    spec = env.tier(tier)
    for role, model in (overrides or {}).items():
        if role not in spec.models:
            known = ", ".join(spec.models) or "none"
            raise OpenRebenchError(f"{env.id} ({tier}) has no model role '{role}' (its roles: {known})")
        if not isinstance(model, str) or not model.strip():
            raise OpenRebenchError(f"model role '{role}': give a model, e.g. {role}=openai/gpt-4o-mini "
                                   f"or {role}={LOCAL_MODEL}")
    return {role: str((overrides or {}).get(role, r.model)).strip() for role, r in spec.models.items()}


def resolve_budget(env: Environment, tier: str, usd: float | None = None,
                   tokens: int | None = None, models: Mapping[str, str] | None = None) -> Budget:
    """The run's budget: the tier's, each limit replaced where one is given; the tier's cap on a reply
    where `models` are its own (`TierSpec.own_models`)."""
    default = env.tier(tier).model_budget
    own = env.tier(tier).own_models(models)
    for name, value in (("dollar", usd), ("token", tokens)):
        if value is not None and not value > 0:
            raise OpenRebenchError(f"the model {name} budget must be positive (got {value})")
    return Budget(usd=usd if usd is not None else default.usd if default else None,
                  tokens=tokens if tokens is not None else default.tokens if default else None,
                  reply_tokens=default.reply_tokens if default and own else None)


def check_models(models: Mapping[str, str], budget: Budget) -> None:
    """A dollar budget needs a price for each model (the offline one is free): a one-line error, before
    any run is set up, rather than at the grant."""
    if budget.usd is None:
        return
    prices = model_service().prices  # `--prices` over the table
    unpriced = sorted({m for m in models.values() if find_price(m, prices)[0] is None})
    if unpriced:
        raise OpenRebenchError(f"a dollar budget for the environment's models needs their prices, unknown "
                               f"for {', '.join(unpriced)}: budget tokens instead")


@dataclass
class RunModels:
    """One run's models on the gateway: the agent's grant for the attempt, a grant per scoring."""

    models: dict[str, str]
    budget: Budget
    descriptions: dict[str, str] = field(default_factory=dict)
    scoring_budget: Budget | None = None  # each scoring's (None: the limits of `budget`)
    service: ModelService = field(default_factory=model_service)
    agent_grant: Grant | None = None

    @classmethod
    def for_tier(cls, env: Environment, tier: str, overrides: Mapping[str, str] | None = None,
                 usd: float | None = None, tokens: int | None = None) -> RunModels | None:
        """The run's models, or None where its tier declares none."""
        spec = env.tier(tier)
        if not spec.models:
            return None
        models = resolve_models(env, tier, overrides)
        budget = resolve_budget(env, tier, usd, tokens, models)
        per_scoring = spec.scoring_budget(models)
        return cls(models, budget, {role: r.description for role, r in spec.models.items()},
                   None if per_scoring is None else Budget(
                       usd=per_scoring.usd, tokens=per_scoring.tokens, reply_tokens=per_scoring.reply_tokens))

    @classmethod
    def of_run(cls, run: Run) -> RunModels | None:
        """The models a run was given (its grant.json), else its tier's defaults; None where it has none:
        for scorings outside an attempt (`openrebench start`, `score`, `demo`)."""
        env = run.env
        found = cls.for_tier(env, run.info.tier)
        path = run.path / GRANT_FILE
        if found is None or not path.is_file():
            return found
        try:
            given = json.loads(path.read_text())
            models = {str(k): str(v) for k, v in given["models"].items()}
            budget = Budget(**given.get("budget") or {})
            granted = cls.for_tier(env, run.info.tier, overrides=models)
        except (ValueError, KeyError, TypeError, AttributeError, OpenRebenchError) as e:
            raise OpenRebenchError(f"{path} cannot be read ({type(e).__name__}): remove it to use the "
                                   "tier's default models") from None
        assert granted is not None  # the tier has models (found)
        if "reply_tokens" not in (given.get("budget") or {}):  # written before replies were capped
            budget = dataclasses.replace(budget, reply_tokens=granted.budget.reply_tokens)
        return cls(models, budget, found.descriptions, granted.scoring_budget)

    def _record(self, run: Run) -> None:
        path = run.path / GRANT_FILE
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        served = {role: self.service.model_name(spec) for role, spec in self.models.items()}
        scoring = self.scoring_budget or self.budget
        record = {"models": self.models, "served_as": served, "descriptions": self.descriptions,
                  "budget": dataclasses.asdict(self.budget), "scoring_budget": dataclasses.asdict(scoring)}
        path.write_text(json.dumps(record, indent=1) + "\n")

    def agent(self, run: Run) -> Grant:
        """The attempt's grant (made once): its token is the agent's OPENAI_API_KEY."""
        if self.agent_grant is None:
            self.agent_grant = self.service.grant(run.path, self.models, self.budget, phase=AGENT,
                                                  run_id=f"{run.path.name}/{AGENT}")
            self._record(run)
        return self.agent_grant

    def ensure(self) -> bool:
        """Start the gateway again if it stopped (the grants with it); True when it did."""
        return self.service.ensure()

    @contextlib.contextmanager
    def scoring(self, run: Run, sandboxed: bool, /, *, build: bool = False) -> Iterator[ScoringAccess]:
        """A grant for one scoring, revoked after it: the scoring sandbox sees the gateway's socket
        folder, and the scorer starts through `gateway-forward --exec` (the forwarder's file in the
        package, run by the scorer's Python). With `build`, for an asset build at set-up instead (phase
        `build`, no budget: it is made once per set of models and cached)."""
        # A new id for every scoring (of this process or any other on the run): a fresh budget.
        phase = BUILD if build else SCORING
        run_id = f"{run.path.name}/{phase}-{secrets.token_hex(4)}"
        budget = Budget() if build else self.scoring_budget or self.budget
        grant = self.service.grant(run.path, self.models, budget, phase=phase, run_id=run_id, held_out=True)
        self._record(run)
        log = run.path / USAGE_LOG
        start = log.stat().st_size if log.exists() else 0
        assert grant.socket_dir is not None and grant.socket_path is not None  # the service makes one
        if sandboxed:  # the scoring's own socket, nobody else's
            binds: tuple[Bind, ...] = (Bind(grant.socket_dir, GATEWAY_DIR),)
            prefix = exec_prefix(f"{GATEWAY_DIR}/{SOCKET_NAME}", GATEWAY_PORT, python=sys.executable)
        else:
            binds, prefix = (), exec_prefix(grant.socket_path, 0, python=sys.executable)

        def rows() -> list[dict[str, Any]]:
            return [r for r in _rows_from(log, start) if r.get("grant") == run_id]

        verdict: dict[str, Any] = {}

        def report() -> dict[str, Any]:
            found = rows()
            if not found:
                return {}
            failures = failure_details(found)
            if failures is not None:
                failures.update(verdict)
            return {"models": summarise(found), **({"backend_failures": failures} if failures else {})}

        restarts = self.service.restarts

        def infrastructure() -> str | None:
            """The harness's failure, in fixed words, or None. Calls that failed on the backend's side
            count only where the backend now fails the harness's own known-good request as well: a
            scoring's code can make its own requests fail (a body a library chokes on, a parameter
            llama.cpp answers with a 500), and would otherwise choose an infrastructure failure, one bit
            it sets after reading held-out data."""
            lost = not self.service.alive or self.service.restarts != restarts
            found = rows()
            message = backend_failures(found, gateway_lost=lost)
            if message is None or lost:
                return message
            failed = {(str(r.get("role")), "completions" if r.get("endpoint") == "completions" else "chat")
                      for r in found if r.get("status") in BACKEND_FAILED}
            healthy = all(self.service.answers(grant.token, role, endpoint)
                          for role, endpoint in sorted(failed))
            verdict["backend_answers_now"] = healthy
            return None if healthy else message

        try:
            yield ScoringAccess(binds=binds, env={"OPENAI_API_KEY": grant.token}, prefix=tuple(prefix),
                                report=report, infrastructure=infrastructure, models=dict(self.models))
        finally:
            self.service.revoke(grant.token)

    def close(self) -> None:
        if self.agent_grant is not None:
            self.service.revoke(self.agent_grant.token)
            self.agent_grant = None


BACKEND_FAILED = {500, 502, 503}
"""Statuses of requests that failed on the harness's side: the gateway's own error, a backend that
failed or could not be reached (after the gateway's retries). A 504 is not among them: a call that ran
past the gateway's limit was asked for (or waited behind the run's own requests). 4xx are the client's."""


BACKEND_FAILED_MESSAGE = "the model backend failed during the scoring"
"""The whole of what the agent is told: fixed words. A failed call's text can quote its request (llama.cpp
echoes a bad parameter back) and the scored code writes the request after reading held-out data, and
how many calls failed is a number that code can choose; both stay in the row's hidden details."""


def backend_failures(rows: list[dict[str, Any]], gateway_lost: bool = False) -> str | None:
    """What failed on the harness's side among a scoring's model calls, in fixed words, or None."""
    if gateway_lost:
        return "the model gateway stopped during the scoring"
    return BACKEND_FAILED_MESSAGE if any(r.get("status") in BACKEND_FAILED for r in rows) else None


def failure_details(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For the row's details (never shown to the agent): how many of a scoring's calls failed on the
    harness's side, and the first one's status and error."""
    failed = [r for r in rows if r.get("status") in BACKEND_FAILED]
    if not failed:
        return None
    return {"failed": len(failed), "calls": len(rows), "first_status": failed[0].get("status"),
            "first_error": str(failed[0].get("error") or "")[:300]}


def _rows_from(path: Path, offset: int) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    rows = []
    for line in data.splitlines():
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def model_usage(run: Run) -> dict[str, Any] | None:
    """What the run was given (models, budget) and what it used, overall and by role, phase and model
    (from its usage log), or None where it had no models."""
    grant = run.path / GRANT_FILE
    if not grant.is_file():
        return None
    try:
        given = json.loads(grant.read_text())
    except ValueError:
        given = {}
    return {"given": given, **summarise(_rows_from(run.path / USAGE_LOG, 0))}
