"""The trajectory assembler over shuffled, interleaved, duplicated and incomplete episodes (no bus)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from consumers.assembler import TrajectoryAssembler
from consumers.config import AssemblerConfig
from consumers.runtime import DriverCore
from consumers.state import ChangelogStateStore
from consumers.state_refs import InputRef
from consumers.synthetic import CapturedRecord, SyntheticEpisode, synthetic_episode
from orchard.bus import Record
from orchard.bus.base import partition_for_key
from orchard.codec import Codec
from orchard.trajectory import Trajectory, trajectory_from_records
from orchard.trajectory_records import trajectory_from_record

CODEC = Codec.default()
PARTITIONS = 4


class Harness:
    """An assembler fed record by record, committing after each, as the runtime would after each batch."""

    def __init__(self, config: AssemblerConfig | None = None) -> None:
        self.config = config or AssemblerConfig()
        self.state = ChangelogStateStore(PARTITIONS)
        self.changelog: list = []
        self.offsets = [0] * PARTITIONS
        self.inputs: dict[InputRef, bytes] = {}  # what the input topics hold, for restores to read back
        self.out: list = []
        self.restart()

    def restart(self) -> None:
        """A new process: fresh assembler, state restored from the changelog written so far."""
        self.processor = TrajectoryAssembler(self.config)
        self.state = ChangelogStateStore(PARTITIONS)
        records = [Record("c", c.partition, i, 0, c.key, c.value) for i, c in enumerate(self.changelog)]
        self.state.restore(records, resolve=lambda refs: {r: self.inputs[r] for r in refs if r in self.inputs})
        self.driver = DriverCore(self.processor, self.state, group="assembler")
        self.processor.open(self.state)

    def feed(self, records: Iterable[CapturedRecord], at_ms: int = 1_000) -> None:
        for captured in records:
            partition = partition_for_key(captured.key or b"", PARTITIONS)
            offset = self.offsets[partition]
            self.offsets[partition] += 1
            self.inputs[InputRef(captured.topic, partition, offset)] = captured.value
            self.driver.handle(Record(captured.topic, partition, offset, at_ms, captured.key, captured.value))
            self._commit()

    def punctuate(self, now_ms: int) -> None:
        self.driver.punctuate(now_ms)
        self._commit()

    def _commit(self) -> None:
        self.changelog += self.state.changelog()
        self.state.commit()
        self.out += self.driver.take_outbox()

    def trajectories(self) -> dict[str, Trajectory]:
        result = {}
        for out in self.out:
            if out.topic == "trajectories":
                trajectory = trajectory_from_record(CODEC.decode(out.value).record)
                assert trajectory.episode_id not in result, f"{trajectory.episode_id} emitted twice"
                result[trajectory.episode_id] = trajectory
        return result

    def letters(self) -> list[dict]:
        return [CODEC.decode(o.value).record for o in self.out if o.topic == "dead-letters"]


def expected(episode: SyntheticEpisode) -> Trajectory:
    calls = [CODEC.decode(c.value).record for c in episode.calls]
    return trajectory_from_records(calls, CODEC.decode(episode.outcome.value).record)


def assert_same(got: Trajectory, want: Trajectory) -> None:
    assert (got.episode_id, got.complete, got.reward, got.group_id, got.status, len(got.steps)) == (
        want.episode_id, want.complete, want.reward, want.group_id, want.status, len(want.steps),
    )  # fmt: skip
    for a, b in zip(got.steps, want.steps, strict=True):
        assert a.call_index == b.call_index
        assert np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
        assert np.array_equal(a.completion_token_ids, b.completion_token_ids)
        assert a.request_messages == b.request_messages


def test_shuffled_interleaved_episodes_each_become_exactly_their_trajectory() -> None:
    episodes = [synthetic_episode(f"ep-{i}", calls=1 + i % 6, seed=i) for i in range(40)]
    records = [r for e in episodes for r in e.records]
    records = [records[i] for i in np.random.default_rng(7).permutation(len(records))]
    harness = Harness()
    harness.feed(records)
    got = harness.trajectories()
    assert sorted(got) == sorted(e.episode_id for e in episodes)
    for episode in episodes:
        assert_same(got[episode.episode_id], expected(episode))
    assert sorted(key for key, _ in harness.state.items()) == sorted(f"d/{e.episode_id}" for e in episodes)


def test_duplicates_are_ignored_and_the_trajectory_is_emitted_once() -> None:
    episode = synthetic_episode("dup", calls=4, seed=1)
    harness = Harness()
    harness.feed([episode.calls[0], episode.calls[0], episode.calls[2], episode.outcome, episode.outcome])
    harness.feed([episode.calls[1], episode.calls[3], episode.calls[1], episode.outcome])
    assert list(harness.trajectories()) == ["dup"]
    assert (harness.processor.duplicates, harness.letters()) == (4, [])


def test_state_survives_a_restart_between_any_two_records() -> None:
    episodes = [synthetic_episode(f"r-{i}", calls=3, seed=i) for i in range(6)]
    records = [r for e in episodes for r in e.records]
    records = [records[i] for i in np.random.default_rng(3).permutation(len(records))]
    harness = Harness()
    for record in records:
        harness.feed([record])
        harness.restart()
    got = harness.trajectories()
    assert sorted(got) == sorted(e.episode_id for e in episodes)
    for episode in episodes:
        assert_same(got[episode.episode_id], expected(episode))


def test_the_changelog_references_the_calls_instead_of_copying_them() -> None:
    episode = synthetic_episode("open", calls=5, seed=4, first_prompt_tokens=500)
    harness = Harness()
    harness.feed(episode.calls)  # no outcome: all five calls stay in the state
    assert sorted(key for key, _ in harness.state.items()) == sorted(f"c/{i}/open" for i in range(5))
    assert max(len(change.value) for change in harness.changelog) < 64 < min(len(c.value) for c in episode.calls)
    harness.restart()
    harness.feed([episode.outcome])
    assert_same(harness.trajectories()["open"], expected(episode))


def test_an_episode_without_outcome_times_out_incomplete_with_the_reason() -> None:
    episode = synthetic_episode("lost-outcome", calls=3, seed=2)
    harness = Harness(AssemblerConfig(outcome_timeout_s=60, calls_timeout_s=10))
    harness.feed(episode.calls, at_ms=1_000)
    harness.punctuate(60_999)
    assert harness.trajectories() == {}
    harness.punctuate(61_000)
    [out] = [o for o in harness.out if o.topic == "trajectories"]
    record = CODEC.decode(out.value).record
    assert (record["complete"], record["incomplete_reason"], len(record["calls"]), record["outcome"]) == (
        False, "no outcome within 60s of the episode's latest model call (3 calls received)", 3, None,
    )  # fmt: skip
    assert record["timestamp"].timestamp() * 1000 == 61_000  # the deadline, not the wall clock
    trajectory = harness.trajectories()["lost-outcome"]
    assert (trajectory.complete, len(trajectory.steps)) == (False, 3)


def test_missing_calls_time_out_and_a_late_call_is_dead_lettered() -> None:
    episode = synthetic_episode("lost-call", calls=4, seed=3)
    harness = Harness(AssemblerConfig(outcome_timeout_s=600, calls_timeout_s=5))
    harness.feed([episode.calls[0], episode.calls[1], episode.calls[3], episode.outcome], at_ms=1_000)
    harness.punctuate(6_000)
    trajectory = harness.trajectories()["lost-call"]
    assert (trajectory.complete, trajectory.incomplete_reason) == (
        False, "3 of 4 model calls arrived within 5s of the outcome",
    )  # fmt: skip
    assert [s.call_index for s in trajectory.steps] == [0, 1]  # call 3 builds on the missing call 2
    harness.feed([episode.calls[2]])
    [letter] = harness.letters()
    assert (letter["error_type"], letter["source_topic"]) == ("LateRecord", "model-calls")
    assert "arrived after the episode was emitted as incomplete" in letter["reason"]


def test_an_outcome_counting_fewer_calls_than_indices_completes_on_the_count() -> None:
    """A call the proxy failed to publish uses up its index: calls 0 and 2, num_model_calls 2."""
    episode = synthetic_episode("gap", calls=3, seed=4)
    outcome = CODEC.decode(episode.outcome.value).record | {"num_model_calls": 2}
    harness = Harness()
    harness.feed([episode.calls[0], episode.calls[2]])
    assert harness.out == []
    harness.feed([CapturedRecord("outcomes", b"gap", CODEC.encode("EpisodeOutcome", outcome))])
    [out] = harness.out
    record = CODEC.decode(out.value).record
    assert (record["complete"], record["calls"]) == (True, [episode.calls[0].value, episode.calls[2].value])


def test_emitted_episodes_are_forgotten_after_retention() -> None:
    episode = synthetic_episode("old", calls=1, seed=5)
    harness = Harness(AssemblerConfig(closed_retention_s=10))
    harness.feed(episode.records, at_ms=1_000)
    harness.punctuate(10_999)
    assert "old" in harness.processor.closed
    harness.punctuate(11_000)
    assert (harness.processor.closed, list(harness.state.items())) == ({}, [])


def test_a_trajectory_is_keyed_by_its_task_so_a_rollout_group_shares_one_partition() -> None:
    episodes = [synthetic_episode(f"ep-{i}", calls=2, seed=i, task_id=f"task-{i % 3}") for i in range(12)]
    harness = Harness()
    harness.feed(r for e in episodes for r in e.records)
    keys = {CODEC.decode(o.value).record["episode_id"]: o.key for o in harness.out if o.topic == "trajectories"}
    assert keys == {e.episode_id: f"task-{i % 3}".encode() for i, e in enumerate(episodes)}
