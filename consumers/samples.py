"""The sample builder: trajectories and dense scores become ``TrainingSample`` records (work in progress)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SampleBuilderConfig(BaseModel):
    """Settings of the sample builder (group size and timeout, scorer weights, credit rules)."""

    model_config = ConfigDict(extra="forbid")
