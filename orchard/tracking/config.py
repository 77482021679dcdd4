"""Tracker settings: one model per backend, picked by ``type``; importable without any tracker package."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorBoardTrackerConfig(_Strict):
    """TensorBoard event files, written with ``tensorboardX`` (no TensorFlow, no TensorBoard server needed)."""

    type: Literal["tensorboard"] = "tensorboard"
    dir: Path | None = Field(None, description="Log directory (default: RUN_DIR/tracking/tensorboard).")


class WandbTrackerConfig(_Strict):
    """A Weights & Biases run; ``offline`` (the default) writes it under the run directory for ``wandb sync``."""

    type: Literal["wandb"] = "wandb"
    mode: Literal["offline", "online"] = Field("offline", description="'online' needs WANDB_API_KEY set.")
    project: str = Field("orchard", min_length=1, description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (user or team); None: the account's default.")
    dir: Path | None = Field(None, description="Where the wandb/ folder goes (default: RUN_DIR/tracking).")


TrackerConfig = Annotated[TensorBoardTrackerConfig | WandbTrackerConfig, Field(discriminator="type")]
"""The settings of one tracker."""

TRACKER_TYPES = ("tensorboard", "wandb")
