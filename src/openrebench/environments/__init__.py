"""The registry of environments: adding one means adding its folder and one line here."""

from __future__ import annotations

from openrebench.core import Environment, OpenRebenchError

from .fix_embedding.env import FixEmbedding
from .optimize_finetune.env import OptimizeFinetune
from .optimize_kernel.env import OptimizeKernel
from .restricted_mlm.env import RestrictedMLM
from .scaling_law.env import ScalingLaw

ENVIRONMENTS: dict[str, type[Environment]] = {
    env.id: env for env in (OptimizeKernel, FixEmbedding, RestrictedMLM, ScalingLaw, OptimizeFinetune)}


def get_environment(env_id: str) -> Environment:
    try:
        return ENVIRONMENTS[env_id]()
    except KeyError:
        raise OpenRebenchError(f"unknown environment '{env_id}' (known: {', '.join(ENVIRONMENTS)})") from None
