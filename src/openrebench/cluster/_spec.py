"""What one attempt is (environment × agent × model × epoch, with every setting that changes its
result) and what it asks of a node: shared by the driver and the nodes.

An attempt's id is readable and stable: the same settings give the same id, so a driver that starts
again over the same queue finds its attempts; a changed setting is a different attempt.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, field_validator

from openrebench.runs import get_environment

# The sandbox's memory limit (the harness's SandboxConfig default): the agent's processes may hold
# this much while a scoring runs beside them with the tier's own limit, so an attempt asks for both.
SANDBOX_MEMORY_GB = 8.0
# A mini tier is made for a 2-core CPU. A GPU tier gets 8 cores per GPU: the paper's H100 nodes had
# more, but an agent's work beside a GPU job is mostly one process feeding it.
MINI_CPUS = 2.0
CPUS_PER_GPU = 8.0


class AttemptSpec(BaseModel, frozen=True):
    """One attempt as the driver queues it and a node runs it: the arguments of the environment's
    Inspect task, the agent's model and the epoch (1-based; each epoch is an eval of its own)."""

    env_id: str
    tier: str
    agent: str
    model: str | None = None
    epoch: int = 1
    time_limit_s: float | None = None
    isolation: str = "auto"
    message_limit: str | None = None
    token_limit: str | None = None
    env_models: tuple[tuple[str, str], ...] = ()  # (role, model) pairs, sorted
    model_budget_usd: float | None = None
    model_budget_tokens: str | None = None

    @field_validator("env_models", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        return tuple(sorted(value.items())) if isinstance(value, Mapping) else value

    @property
    def id(self) -> str:
        """`<env>-<tier>-<agent>[-<model>]-e<epoch>-<hash>`: a folder name, unique per settings."""
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:8]
        model = f"-{_slug(self.model)}" if self.model else ""
        return f"{self.env_id}-{self.tier}-{self.agent}{model}-e{self.epoch}-{digest}"

    def task_args(self) -> dict[str, Any]:
        """Keyword arguments of the environment's Inspect task (`harness.environment_tasks()[id]`)."""
        args: dict[str, Any] = {"tier": self.tier, "agent": self.agent, "time_limit": self.time_limit_s,
                                "isolation": self.isolation, "message_limit": self.message_limit,
                                "token_limit": self.token_limit, **dict(self.env_models)}
        if get_environment(self.env_id).tier(self.tier).models:  # only such tasks take a budget
            args |= {"model_budget_usd": self.model_budget_usd,
                     "model_budget_tokens": self.model_budget_tokens}
        return args

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> AttemptSpec:
        return cls.model_validate(json.loads(text))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:40]


@dataclass(frozen=True)
class Resources:
    """What an attempt holds on its node for its whole life, as Ray resources."""

    cpus: float
    gpus: int
    memory_bytes: int

    def ray_options(self) -> dict[str, Any]:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus, "memory": self.memory_bytes}

    def fits(self, node: Mapping[str, float]) -> bool:
        """Whether a node with these total resources (Ray's `Resources` of `ray.nodes()`) can hold it."""
        return (node.get("CPU", 0.0) >= self.cpus and node.get("GPU", 0.0) >= self.gpus
                and node.get("memory", 0.0) >= self.memory_bytes)

    def describe(self) -> str:
        return f"{self.gpus} GPU(s), {self.cpus:g} CPU(s), {self.memory_bytes / 1024**3:.0f} GiB"


def attempt_resources(env_id: str, tier: str) -> Resources:
    """The tier's GPUs (held exclusively), CPUs and memory: the sandbox's limit plus the scorer's."""
    spec = get_environment(env_id).tier(tier)
    gpus = spec.gpu_count
    cpus = CPUS_PER_GPU * gpus if gpus else MINI_CPUS
    memory = int((SANDBOX_MEMORY_GB + spec.memory_limit_gb) * 1024**3)
    return Resources(cpus=cpus, gpus=gpus, memory_bytes=memory)
