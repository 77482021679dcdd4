"""Closed-interval helpers."""

from intervals.core import Interval, contains, merge, total_length

__all__ = ["Interval", "contains", "merge", "total_length"]
