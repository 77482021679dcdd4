"""Group plug-ins (``needs_groups = True``) under the reward consumer: held until their rollout group is complete or
timed out, scored together, each member's scores keyed by its task (as its trajectory) and counted; a restart
mid-group loses and duplicates nothing; their scores reach the sample builder's samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from consumers.builtin import build_processor
from consumers.config import ConsumersConfig, RewardsConfig
from consumers.processor import Input
from consumers.reward_consumer import RewardConsumer
from consumers.rewards import RewardPlugin, Score
from consumers.runtime import DriverCore, OutRecord
from consumers.samples import SampleBuilder, SampleBuilderConfig
from consumers.state import ChangelogStateStore
from consumers.synthetic import synthetic_episode
from orchard.bus import Record
from orchard.bus.base import partition_for_key
from orchard.codec import Codec
from orchard.tokens import unpack_array
from orchard.trajectory import Trajectory
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()
PARTITIONS = 4
COMPLETION = 4  # completion tokens per call


def trajectory_bytes(episode_id: str, reward: float, group: str = "g1", calls: int = 2, at_ms: int = 1_000) -> bytes:
    """An encoded ``Trajectory`` of a synthetic episode of rollout group ``group`` (``calls=0``: no steps)."""
    episode = synthetic_episode(
        episode_id, calls=max(calls, 1), seed=len(episode_id), first_prompt_tokens=8, completion_tokens=COMPLETION,
        tool_output_tokens=3, group_id=group, reward=reward, task_id="t",
    )  # fmt: skip
    record = trajectory_record(
        run_id="synthetic", episode_id=episode_id, task_id="t", calls=[c.value for c in episode.calls][:calls],
        outcome=episode.outcome.value, outcome_fields=CODEC.decode(episode.outcome.value).record, policy_version=1,
        timestamp_ms=at_ms,
    )  # fmt: skip
    return CODEC.encode("Trajectory", record)


class CentredReward(RewardPlugin):
    """A group plug-in: each member's last call scores its reward minus the group's mean; remembers what it saw."""

    name = "centred"
    needs_groups = True

    def __init__(self) -> None:
        self.groups: list[list[str]] = []

    def score_group(self, trajectories: Sequence[Trajectory]) -> dict[str, list[Score]]:
        self.groups.append([t.episode_id for t in trajectories])
        mean = sum(t.reward for t in trajectories) / len(trajectories)
        return {t.episode_id: [Score(t.steps[-1].call_index, t.reward - mean)] for t in trajectories}


class Harness:
    """A reward consumer fed record by record, committing after each as the runtime does after a batch."""

    def __init__(self, plugin: RewardPlugin, config: RewardsConfig | None = None) -> None:
        self.plugin, self.config = plugin, config or RewardsConfig(group_size=3, group_timeout_ms=5_000)
        self.changelog: list[Any] = []
        self.offsets = [0] * PARTITIONS
        self.out: list[OutRecord] = []
        self.restart()

    def restart(self) -> None:
        """A new process: a fresh consumer, state restored from the changelog committed so far."""
        self.processor = RewardConsumer(self.plugin, config=self.config)
        self.state = ChangelogStateStore(PARTITIONS)
        self.state.restore(Record("c", c.partition, i, 0, c.key, c.value) for i, c in enumerate(self.changelog))
        self.driver = DriverCore(self.processor, self.state, group=self.processor.name)
        self.processor.open(self.state)

    def feed(self, episode_id: str, value: bytes, at_ms: int, *, commit: bool = True) -> None:
        partition = partition_for_key(episode_id.encode(), PARTITIONS)
        offset = self.offsets[partition]
        self.driver.handle(Record("trajectories", partition, offset, at_ms, episode_id.encode(), value))
        if commit:
            self.offsets[partition] += 1
            self.commit()

    def punctuate(self, now_ms: int) -> None:
        self.driver.punctuate(now_ms)
        self.commit()

    def crash(self) -> None:
        """The batch never committed: its outputs and state changes are gone, its inputs will come again."""
        self.driver.take_outbox()
        self.state.rollback()
        self.restart()

    def commit(self) -> None:
        self.changelog += self.state.changelog()
        self.state.commit()
        self.out += self.driver.take_outbox()

    def scores(self) -> list[tuple[str, int, float, int | None]]:
        """(episode, call, score, episode_score_count) of every StepScore emitted, in order (keys checked: the task,
        so a group's scores share a partition with its trajectories)."""
        result = []
        for out in self.out:
            record = CODEC.decode(out.value).record
            if out.topic == "scores":
                assert out.key == b"t"  # every trajectory here is of task "t"
                result.append((record["episode_id"], record["call_index"], record["score"],
                               record["episode_score_count"]))  # fmt: skip
        return result

    def letters(self) -> list[dict[str, Any]]:
        return [CODEC.decode(o.value).record for o in self.out if o.topic == "dead-letters"]


def test_a_group_plugin_sees_every_member_of_its_group_once_the_group_is_complete() -> None:
    harness = Harness(CentredReward())
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.feed("x0", trajectory_bytes("x0", 1.0, group="g2"), 1_001)  # another group, still open at the end
    harness.feed("e1", trajectory_bytes("e1", 0.0), 1_002)
    assert (harness.plugin.groups, harness.scores()) == ([], [])  # type: ignore[attr-defined]
    harness.feed("e2", trajectory_bytes("e2", 0.5), 1_003)
    assert harness.plugin.groups == [["e0", "e1", "e2"]]  # type: ignore[attr-defined]
    assert harness.scores() == [("e0", 1, 0.5, 1), ("e1", 1, -0.5, 1), ("e2", 1, 0.0, 1)]


def test_a_group_that_never_fills_is_scored_when_it_times_out() -> None:
    harness = Harness(CentredReward())
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.feed("e1", trajectory_bytes("e1", 0.0), 2_000)
    harness.punctuate(5_999)
    assert harness.scores() == []
    harness.punctuate(6_000)  # 5 s after the group opened
    assert harness.scores() == [("e0", 1, 0.5, 1), ("e1", 1, -0.5, 1)]
    harness.feed("e2", trajectory_bytes("e2", 0.0), 7_000)  # a late member opens a new group under the same key
    harness.punctuate(12_000)
    assert harness.plugin.groups == [["e0", "e1"], ["e2"]]  # type: ignore[attr-defined]


def test_a_member_without_steps_counts_towards_the_group_but_is_not_scored() -> None:
    harness = Harness(CentredReward())
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.feed("e1", trajectory_bytes("e1", 0.0, calls=0), 1_001)
    harness.feed("e2", trajectory_bytes("e2", 0.0), 1_002)
    assert harness.plugin.groups == [["e0", "e2"]]  # type: ignore[attr-defined]
    assert [s[0] for s in harness.scores()] == ["e0", "e2"]


def test_a_restart_mid_group_loses_nothing_and_duplicates_nothing() -> None:
    harness = Harness(CentredReward())
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.restart()
    harness.feed("e1", trajectory_bytes("e1", 0.0), 1_002)
    harness.feed("e2", trajectory_bytes("e2", 0.5), 1_003, commit=False)
    harness.crash()  # e2's batch is lost; e2 comes again
    harness.feed("e2", trajectory_bytes("e2", 0.5), 1_003)
    harness.restart()
    harness.feed("e3", trajectory_bytes("e3", 0.5), 1_004)  # the next group's first member, after the restart
    harness.restart()
    harness.punctuate(6_004)  # the restored clock and group: it times out on time
    # the lost batch scored the group too, but nothing it emitted was committed; the retry sees every member again
    assert harness.plugin.groups == [["e0", "e1", "e2"], ["e0", "e1", "e2"], ["e3"]]  # type: ignore[attr-defined]
    assert harness.scores() == [("e0", 1, 0.5, 1), ("e1", 1, -0.5, 1), ("e2", 1, 0.0, 1), ("e3", 1, 0.0, 1)]
    assert dict(harness.state.items()) == {"clock": b"1004"}


def test_a_failing_group_plugin_dead_letters_every_member_and_an_invalid_score_only_its_member() -> None:
    class Broken(CentredReward):
        def score_group(self, trajectories: Sequence[Trajectory]) -> dict[str, list[Score]]:
            raise ZeroDivisionError("no mean")

    harness = Harness(Broken(), RewardsConfig(group_size=2))
    e0 = trajectory_bytes("e0", 1.0)
    harness.feed("e0", e0, 1_000)
    harness.feed("e1", trajectory_bytes("e1", 0.0), 1_001)
    letters = harness.letters()
    assert [(x["source_key"], x["source_topic"], x["error_type"], x["consumer_group"]) for x in letters] == [
        (b"e0", "trajectories", "ZeroDivisionError", "reward-centred"),
        (b"e1", "trajectories", "ZeroDivisionError", "reward-centred"),
    ]
    assert "rollout group synthetic/group/g1" in letters[0]["reason"] and "no mean" in letters[0]["reason"]
    assert (letters[0]["original"], letters[0]["timestamp"].timestamp()) == (e0, 1.001)  # as read; at the close

    class OffByOne(CentredReward):
        def score_group(self, trajectories: Sequence[Trajectory]) -> dict[str, list[Score]]:
            return {"e0": [Score(0, 1.0)], "e1": [Score(9, 1.0)]}  # e1 has no call 9

    harness = Harness(OffByOne(), RewardsConfig(group_size=2))
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.feed("e1", trajectory_bytes("e1", 0.0), 1_001)
    assert (harness.scores(), [x["source_key"] for x in harness.letters()]) == ([("e0", 0, 1.0, 1)], [b"e1"])


def test_a_group_plugin_abstaining_on_a_member_still_says_it_is_done_with_it() -> None:
    class FirstOnly(CentredReward):
        def score_group(self, trajectories: Sequence[Trajectory]) -> dict[str, list[Score]]:
            first = trajectories[0]
            return {first.episode_id: [Score(0, 1.0), Score(1, 2.0)]}

    harness = Harness(FirstOnly(), RewardsConfig(group_size=2))
    harness.feed("e0", trajectory_bytes("e0", 1.0), 1_000)
    harness.feed("e1", trajectory_bytes("e1", 0.0), 1_001)
    [*scored, (episode, call, nan, count)] = harness.scores()
    assert (scored, episode, call, math.isnan(nan), count) == ([("e0", 0, 1.0, 2), ("e0", 1, 2.0, 2)], "e1", 1, True, 1)


def test_group_scores_reach_the_samples_as_soon_as_every_members_count_is_in() -> None:
    harness = Harness(CentredReward())
    values = {"e0": trajectory_bytes("e0", 1.0), "e1": trajectory_bytes("e1", 0.0), "e2": trajectory_bytes("e2", 0.5)}
    builder = SampleBuilder(SampleBuilderConfig(group_size=3, scorers={"centred": 1.0}, outcome_weight=0.0,
                                                score_settle_ms=60_000))  # fmt: skip
    builder.open(ChangelogStateStore())
    samples: list[dict[str, Any]] = []

    def emit(topic: str, schema: str, record: Any, key: Any = None) -> None:
        samples.append(dict(record))

    for at, (episode_id, value) in enumerate(values.items(), start=1_000):
        harness.feed(episode_id, value, at)
        builder.process(Input("trajectories", "Trajectory", CODEC.decode(value).record, episode_id.encode(), at, 0, at),
                        emit)  # fmt: skip
    for offset, out in enumerate(harness.out):
        builder.process(Input("scores", "StepScore", CODEC.decode(out.value).record, out.key, out.timestamp_ms, 0,
                              offset), emit)  # fmt: skip
    dense = {s["episode_id"]: sorted(set(unpack_array(s["advantages"], "float32").tolist()) - {0.0}) for s in samples}
    assert dense == {"e0": [0.5], "e1": [-0.5]}  # e2 scored 0: an all-zero sample is not emitted
    counts = {s["episode_id"]: int((unpack_array(s["advantages"], "float32") != 0).sum()) for s in samples}
    assert counts == {"e0": COMPLETION, "e1": COMPLETION}  # the last call's completion tokens only
    assert {s["created_at"] for s in samples} == {1_002}  # the moment the last count came: no settle time


def test_group_settings_default_to_the_sample_builders_groups_and_bad_ones_name_the_field() -> None:
    plugin = CentredReward()
    consumer = RewardConsumer(plugin, sample_builder=SampleBuilderConfig(group_size=5, group_by="task_version"))
    assert (consumer.group_size, consumer.group_timeout_ms, consumer.group_by) == (5, 60_000, "task_version")
    config = ConsumersConfig.model_validate({"rewards": {"group_size": 2, "group_timeout_ms": 10}})
    built = build_processor("consumers.rewards:RewardPlugin", config)
    assert isinstance(built, RewardConsumer) and (built.group_size, built.group_timeout_ms) == (2, 10)
    bad_settings = [
        ({"group_size": 0}, "rewards.group_size"),
        ({"group_timeout_ms": -1}, "rewards.group_timeout_ms"),
        ({"group_by": "task"}, "rewards.group_by"),
        ({"size": 3}, "rewards.size"),
    ]
    for bad, field in bad_settings:
        with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
            ConsumersConfig.model_validate({"rewards": bad})
