"""Which groups may be set against which. The paper's humans worked on the paper's full-size tasks and are
scored on the paper's scale, so a group of ours stands beside them (and beside the paper's agents) only at
the same size, the full tier, and on the same scale, the paper-matched one. Groups of another tier (mini:
the same task at a size that runs in minutes on a CPU), or of the full tier on the measured scale, form
cohorts of their own: compared only within their cohort (with a person's own runs of the human agent at
the same tier, say), never with the paper's humans, and shown in tables and figure panels of their own."""

from __future__ import annotations

from collections.abc import Sequence

from ._model import Attempt
from ._paper import PAPER_TIER

PAPER_COHORT = "paper"
# Our tier that is the paper's setting: the full tier is the paper's task on one GPU node, scaled only where
# the paper's compute is out of reach (docs: DESIGN, "Tiers"); mini is the same task shrunk to a CPU.
PAPER_SIZE_TIERS: frozenset[str] = frozenset({"full"})


def cohort_of(attempts: Sequence[Attempt]) -> tuple[str, str | None]:
    """A group's cohort, and why it is not comparable with the paper's humans (None: it is). Our runs must
    be scaled first (`with_normalisation` sets each run's `scale`)."""
    if all(a.tier == PAPER_TIER for a in attempts):
        return PAPER_COHORT, None
    tier = "/".join(sorted({a.tier for a in attempts}))
    scales = sorted({a.scale or "measured" for a in attempts})
    key = f"tier {tier}, {'/'.join(scales)} scale"
    if not {a.tier for a in attempts} <= PAPER_SIZE_TIERS:
        return key, f"tier {tier}"
    if scales != ["paper"]:
        scale = "measured scale" if scales == ["measured"] else "partly on the measured scale"
        return key, f"tier {tier}, {scale}"
    return PAPER_COHORT, None


def not_comparable(why: str) -> str:
    """The mark of a group, table or panel kept apart from the paper's humans."""
    return f"not comparable with the paper's humans ({why})"


def why_apart(why: str) -> str:
    """Why a cohort is kept apart, in a clause for the notes."""
    if why.startswith("tier ") and "," not in why:
        return ("the paper's humans worked on the paper's full-size tasks; a run of another tier is the same "
                "task at another size, whose score means something else")
    return ("the measured scale's reference is not the paper's (ours can be much stronger), so its scores "
            "are not on the paper's humans' scale; --normalisation paper puts full-tier runs on it")
