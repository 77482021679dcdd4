"""POSIX path helpers."""

from pathutils.paths import common_parent, split_ext

__all__ = ["common_parent", "split_ext"]
