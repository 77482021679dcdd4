"""Experiment tracking: a run's trainer, evaluation and throughput figures sent to TensorBoard or W&B.

Nothing in a trainer changes: a ``Follower`` reads what the run already writes (``metrics.jsonl``, ``results.json``,
the ``outcomes`` topic) and sends it to a ``Tracker`` opened by ``open_tracker`` from a config keyed by ``type``.
"""

from orchard.tracking.base import Scalars, Table, Tracker
from orchard.tracking.config import TensorBoardTrackerConfig, TrackerConfig, WandbTrackerConfig
from orchard.tracking.exceptions import TrackerUnavailableError, TrackingError
from orchard.tracking.factory import open_tracker
from orchard.tracking.follower import Follower, follow, run_over

__all__ = [
    "Follower",
    "Scalars",
    "Table",
    "TensorBoardTrackerConfig",
    "Tracker",
    "TrackerConfig",
    "TrackerUnavailableError",
    "TrackingError",
    "WandbTrackerConfig",
    "follow",
    "open_tracker",
    "run_over",
]
