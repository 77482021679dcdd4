"""Descriptive statistics."""

from descstats.core import mean, mode, percentile, variance

__all__ = ["mean", "mode", "percentile", "variance"]
