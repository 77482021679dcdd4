"""Trajectory datasets in and out: ``orchard import`` (chat-format files to ModelCall/EpisodeOutcome records) and
``orchard export`` (recorded episodes to Parquet or JSONL in the documented ``orchard`` layout)."""

from orchard.datasets.exceptions import DatasetError, RowError
from orchard.datasets.layouts import LAYOUTS, Layout, layout_with_overrides

__all__ = ["LAYOUTS", "DatasetError", "Layout", "RowError", "layout_with_overrides"]
