"""Held-out evaluation: success rates with confidence intervals, a per-run results table, reward curves."""

from orchard.evaluation.heldout import HeldoutConfig, HeldoutResult, evaluate_heldout
from orchard.evaluation.results import record_stage
from orchard.evaluation.stats import mean_stats, success_stats

__all__ = ["HeldoutConfig", "HeldoutResult", "evaluate_heldout", "mean_stats", "record_stage", "success_stats"]
