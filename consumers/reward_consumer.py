"""Runs a ``RewardPlugin`` over assembled trajectories and publishes its scores as ``StepScore`` records.

One consumer group per plug-in (``reward-<scorer name>``), so a user's reward runs beside Orchard's own with no
change to Orchard: ``orchard consumer run mypackage.rewards:MyReward``.

Every trajectory with steps gets at least one ``StepScore`` from each scorer: when the plug-in abstains on the
whole episode, a NaN score on its last call (``details_json`` ``{"abstained": true}``) tells the sample builder
this scorer is done with the episode, so it never waits for scores that will not come. Scores carry the
trajectory record's timestamp, so replays are identical. A plug-in that raises sends the trajectory to the dead
letters (with the error) and the stream carries on.
"""

from __future__ import annotations

import math
from typing import ClassVar

from consumers.processor import Emit, Input, Processor, RecordRejected
from consumers.rewards import RewardPlugin, RewardPluginError, Score, step_score_record
from orchard.codec import Codec
from orchard.topics import SCORES, TRAJECTORIES
from orchard.trajectory_records import record_timestamp_ms, trajectory_from_record


class RewardConsumer(Processor):
    """A reward plug-in as a stream processor: ``trajectories`` in, ``scores`` out, keyed by episode id."""

    name: ClassVar[str] = "reward"
    input_topics: ClassVar[tuple[str, ...]] = (TRAJECTORIES,)
    output_topics: ClassVar[tuple[str, ...]] = (SCORES,)

    def __init__(self, plugin: RewardPlugin, codec: Codec | None = None) -> None:
        """Score with ``plugin``; the consumer group is ``reward-<scorer name>``."""
        if plugin.needs_groups:
            raise RewardPluginError(
                f"reward plug-in {plugin.scorer_name!r} needs whole rollout groups (needs_groups = True), which the "
                "reward consumer does not feed yet; override score_episode or score_step instead"
            )
        self.plugin = plugin
        self.scorer = plugin.scorer_name
        self.name = f"reward-{self.scorer}"  # type: ignore[misc]  # per instance: one group per plug-in
        self.codec = codec or Codec.default()

    def process(self, message: Input, emit: Emit) -> None:
        """Score one trajectory and emit its ``StepScore``s (a NaN abstention if the plug-in gave none)."""
        try:
            trajectory = trajectory_from_record(message.record, self.codec)
        except Exception as exc:
            raise RecordRejected(f"cannot rebuild the trajectory: {exc}", type(exc).__name__) from exc
        if not trajectory.steps:
            return
        timestamp = record_timestamp_ms(message.record)
        try:
            scores = self.plugin.score_episode(trajectory)
            records = [step_score_record(trajectory, score, self.scorer, timestamp) for score in scores]
        except Exception as exc:
            raise RecordRejected(f"reward plug-in {self.scorer!r} failed: {exc}", type(exc).__name__) from exc
        if not records:
            abstained = Score(trajectory.steps[-1].call_index, math.nan, details={"abstained": True})
            records = [step_score_record(trajectory, abstained, self.scorer, timestamp)]
        for record in records:
            emit(SCORES, "StepScore", record, trajectory.episode_id)
