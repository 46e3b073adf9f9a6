"""Analysis of runs: score@k over time budgets, agents against humans, the paper's data, reports."""

from ._analysis import (
    Allocation,
    AlternativeRow,
    Analysis,
    ClaimRow,
    Comparison,
    CostPoint,
    DroppedCell,
    EnvModelRow,
    EnvRow,
    GroupSummary,
    HeadlineRow,
    NormBudgetRow,
    NormRow,
    Settings,
    TimeCurve,
    analyze,
)
from ._budget import default_budgets, runs_for
from ._cohorts import PAPER_COHORT, PAPER_SIZE_TIERS, cohort_of
from ._environments import registered_facts
from ._estimators import (
    SE_FLOOR,
    Estimate,
    bootstrap_expected_max,
    expected_max,
    max_weights,
    prob_best_of_k_beats,
    sample_best_of_k,
    score_at_k,
)
from ._headline import alternative_rows, analyze_paper, paper_headline
from ._load import load_logs
from ._model import (
    AlteredRun,
    Attempt,
    Dataset,
    EnvFacts,
    HumanCount,
    ModelUse,
    PaperTreatment,
    with_normalisation,
)
from ._over_time import best_so_far, interpolated, score_at
from ._paper import (
    HUMAN_GROUP,
    PAPER_AGENTS,
    PAPER_HUMAN_HOURS,
    PUBLISHED,
    RELEASE_ONLY_ENVIRONMENTS,
    by_rebench_id,
    load_paper,
    parse_hours,
)

__all__ = [
    "HUMAN_GROUP", "PAPER_AGENTS", "PAPER_COHORT", "PAPER_HUMAN_HOURS", "PAPER_SIZE_TIERS", "PUBLISHED",
    "RELEASE_ONLY_ENVIRONMENTS", "SE_FLOOR", "Allocation", "AlteredRun",
    "AlternativeRow", "Analysis", "Attempt", "ClaimRow", "Comparison", "CostPoint", "Dataset", "DroppedCell",
    "EnvFacts", "EnvModelRow", "EnvRow", "Estimate", "GroupSummary", "HeadlineRow", "HumanCount", "ModelUse",
    "NormBudgetRow", "NormRow", "PaperTreatment", "Settings", "TimeCurve", "alternative_rows", "analyze",
    "analyze_paper", "best_so_far", "bootstrap_expected_max", "by_rebench_id", "cohort_of", "default_budgets",
    "expected_max", "interpolated", "load_logs", "load_paper", "max_weights", "paper_headline", "parse_hours",
    "prob_best_of_k_beats", "registered_facts", "runs_for", "sample_best_of_k", "score_at", "score_at_k",
    "with_normalisation",
]
