"""Version comparison."""

from versions.compare import compare, parse, sort_versions

__all__ = ["compare", "parse", "sort_versions"]
