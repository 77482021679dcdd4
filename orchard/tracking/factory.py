"""Open the tracker a config's ``type`` names; its package is imported only then."""

from __future__ import annotations

from pathlib import Path

from orchard.tracking.base import Tracker
from orchard.tracking.config import TensorBoardTrackerConfig, TrackerConfig, WandbTrackerConfig


def open_tracker(config: TrackerConfig, run_dir: Path, run_id: str) -> Tracker:
    """The tracker of ``config`` for the run in ``run_dir`` (its files under ``RUN_DIR/tracking`` by default)."""
    if isinstance(config, TensorBoardTrackerConfig):
        from orchard.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(config.dir or run_dir / "tracking" / "tensorboard")
    if isinstance(config, WandbTrackerConfig):
        from orchard.tracking.wandb_tracker import WandbTracker

        return WandbTracker(config, config.dir or run_dir / "tracking", run_id, run_dir)
    raise TypeError(f"unknown tracker config {type(config).__name__}")
