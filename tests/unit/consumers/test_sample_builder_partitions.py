"""The sample builder's state stays with its input partition when a timer fires during another partition's input,
so after a rebalance each instance restores whole groups: nothing lost, nothing left that cannot be completed."""

from __future__ import annotations

from consumers.runtime import DriverCore
from consumers.samples import SampleBuilder, SampleBuilderConfig
from consumers.state import ChangelogRecord, ChangelogStateStore
from consumers.synthetic import synthetic_episode
from orchard.bus import Record
from orchard.codec import Codec
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()
PARTITIONS = 2
# one scorer awaited (it never comes): the wait times out, then the lone member's group times out, both on a timer
CONFIG = SampleBuilderConfig(group_size=2, group_timeout_ms=1_000, scorers={"silent": 1.0}, score_wait_ms=500)


def trajectory(episode_id: str, task_id: str, at_ms: int) -> bytes:
    """An encoded trajectory; rewards alternate with the episode number, so a group of two has a signal."""
    episode = synthetic_episode(episode_id, calls=2, seed=3, first_prompt_tokens=8, completion_tokens=4,
                                tool_output_tokens=3, group_id=f"g-{task_id}", task_id=task_id,
                                reward=float(episode_id.endswith("1")))  # fmt: skip
    record = trajectory_record(
        run_id="synthetic", episode_id=episode_id, task_id=task_id, calls=[c.value for c in episode.calls],
        outcome=episode.outcome.value, outcome_fields=CODEC.decode(episode.outcome.value).record, policy_version=1,
        timestamp_ms=at_ms,
    )  # fmt: skip
    return CODEC.encode("Trajectory", record)


def run(inputs: list[tuple[int, str, str, int]]) -> list[ChangelogRecord]:
    """Feed (partition, episode, task, time) trajectories one per batch; the changelog written."""
    state = ChangelogStateStore(PARTITIONS)
    builder = SampleBuilder(CONFIG)
    driver = DriverCore(builder, state, group="sample-builder")
    builder.open(state)
    changelog: list[ChangelogRecord] = []
    for offset, (partition, episode, task, at_ms) in enumerate(inputs):
        driver.handle(Record("trajectories", partition, offset, at_ms, task.encode(), trajectory(episode, task, at_ms)))
        changelog += state.changelog()
        state.commit()
        driver.take_outbox()
    return changelog


def test_a_wait_and_a_group_that_time_out_during_another_partitions_input_write_to_their_own_partition() -> None:
    changelog = run([(0, "a1", "task-a", 1_000), (1, "b1", "task-b", 10_000)])
    a_keys = {(c.partition, c.key.decode()) for c in changelog if b"a1" in c.key or b"task-a" in c.key}
    assert {key for _, key in a_keys} >= {"traj/a1", "wait/a1", "done/a1"}  # the group opened and closed in one batch
    assert {partition for partition, _ in a_keys} == {0}, sorted(a_keys)


def test_an_instance_restoring_only_the_first_partition_holds_everything_its_waiting_episode_needs() -> None:
    changelog = run([(0, "a1", "task-a", 1_000), (0, "a2", "task-a", 1_100), (1, "b1", "task-b", 1_200)])
    state = ChangelogStateStore(PARTITIONS)
    records = [Record("c", c.partition, i, 0, c.key, c.value) for i, c in enumerate(changelog)]
    state.restore(records, owned={0})
    builder = SampleBuilder(CONFIG)
    driver = DriverCore(builder, state, group="sample-builder")
    builder.open(state)
    driver.punctuate(60_000)  # the new owner's clock: every wait and group of partition 0 is due
    samples = [CODEC.decode(o.value).record for o in driver.take_outbox() if o.topic == "samples"]
    assert sorted(s["episode_id"] for s in samples) == ["a1", "a2"]
