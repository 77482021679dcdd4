"""Errors of held-out evaluation, its results table and its plots."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class EvaluationError(OrchardError):
    """Base class of evaluation errors."""


class ResultsError(EvaluationError):
    """A results table that cannot be read or written."""


class PlotError(EvaluationError):
    """A plot that cannot be drawn (e.g. no outcomes to draw)."""
