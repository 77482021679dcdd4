"""Binning numbers."""

from histogram.bins import histogram

__all__ = ["histogram"]
