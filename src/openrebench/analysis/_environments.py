"""What the analysis knows of environments, asked of the registry: an environment added as a folder or
a plug-in package is analysed with no edit here. The paper's release adds what it alone knows of the
environments not implemented here (`_paper.RELEASE_ONLY_ENVIRONMENTS`); a log of an environment that
is no longer installed carries its own facts (`_load`)."""

from __future__ import annotations

from collections.abc import Mapping

from openrebench.api import Environment
from openrebench.runs import environment_classes, paper_constants

from ._model import EnvFacts

REGISTERED = "registered environment"


def facts_of(cls: type[Environment], source: str = REGISTERED) -> EnvFacts:
    """An environment class's own attributes, as the analysis uses them."""
    return EnvFacts(env_id=cls.id, rebench_id=cls.rebench_id, score_visible=cls.score_visible,
                    direction=cls.direction, source=source, paper_constants=paper_constants(cls, "full"))


def registered_facts() -> dict[str, EnvFacts]:
    """Every registered environment (built-in and installed plug-ins), by id."""
    return {env_id: facts_of(cls) for env_id, cls in environment_classes().items()}


def facts_for(env_ids: list[str], known: Mapping[str, EnvFacts]) -> dict[str, EnvFacts]:
    """Facts for each id: a registered environment's own first, then `known` (what the data brought),
    else the defaults (score visible, best so far) marked as such."""
    registered = registered_facts()
    return {e: registered.get(e) or known.get(e) or EnvFacts(env_id=e, source="unknown (defaults)")
            for e in env_ids}
