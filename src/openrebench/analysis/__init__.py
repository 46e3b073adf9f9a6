"""Analysis of runs: score@k over time budgets, agents against humans, the paper's data, reports."""

from ._analysis import (
    Allocation,
    Analysis,
    Comparison,
    CostPoint,
    EnvModelRow,
    EnvRow,
    GroupSummary,
    HeadlineRow,
    Settings,
    TimeCurve,
    analyze,
)
from ._budget import default_budgets, runs_for
from ._environments import registered_facts
from ._estimators import (
    Estimate,
    bootstrap_expected_max,
    expected_max,
    max_weights,
    prob_best_of_k_beats,
    sample_best_of_k,
    score_at_k,
)
from ._headline import analyze_paper, paper_headline
from ._load import load_logs
from ._model import Attempt, Dataset, EnvFacts, ModelUse
from ._over_time import best_so_far, interpolated, score_at
from ._paper import HUMAN_GROUP, PUBLISHED, RELEASE_ONLY_ENVIRONMENTS, by_rebench_id, load_paper

__all__ = [
    "HUMAN_GROUP", "PUBLISHED", "RELEASE_ONLY_ENVIRONMENTS", "Allocation", "Analysis", "Attempt",
    "Comparison", "CostPoint", "Dataset", "EnvFacts", "EnvModelRow", "EnvRow", "Estimate", "GroupSummary",
    "HeadlineRow", "ModelUse", "Settings", "TimeCurve", "analyze", "analyze_paper", "best_so_far",
    "bootstrap_expected_max", "by_rebench_id", "default_budgets", "expected_max", "interpolated",
    "load_logs", "load_paper", "max_weights", "paper_headline", "prob_best_of_k_beats", "registered_facts",
    "runs_for", "sample_best_of_k", "score_at", "score_at_k",
]
