"""Dependency graphs."""

from depgraph.order import CycleError, toposort

__all__ = ["CycleError", "toposort"]
