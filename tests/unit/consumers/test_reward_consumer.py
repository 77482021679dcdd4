"""A reward plug-in run as a processor: its scores become StepScores, each saying how many its episode got;
abstaining still says it is done."""

from __future__ import annotations

import math

from consumers.builtin import UnknownConsumerError, build_processor
from consumers.processor import Input
from consumers.reward_consumer import RewardConsumer
from consumers.rewards import FunctionReward, RewardPlugin
from consumers.runtime import DriverCore
from consumers.state import ChangelogStateStore
from consumers.synthetic import synthetic_episode
from orchard.bus import Record
from orchard.codec import Codec
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()


def trajectory_bytes(calls: int = 3) -> bytes:
    episode = synthetic_episode("ep-r", calls=calls, seed=1)
    outcome = CODEC.decode(episode.outcome.value).record
    record = trajectory_record(
        run_id="synthetic", episode_id="ep-r", task_id="t", calls=[c.value for c in episode.calls],
        outcome=episode.outcome.value, outcome_fields=outcome, policy_version=1, timestamp_ms=5_000,
    )  # fmt: skip
    return CODEC.encode("Trajectory", record)


def run(plugin: RewardPlugin) -> list[tuple[str, dict]]:
    processor = RewardConsumer(plugin)
    driver = DriverCore(processor, ChangelogStateStore(), group=processor.name)
    driver.handle(Record("trajectories", 0, 0, 9_999, b"ep-r", trajectory_bytes()))
    return [(o.topic, CODEC.decode(o.value).record) for o in driver.take_outbox()]


class LastStepBonus(RewardPlugin):
    name = "last_step_bonus"

    def score_step(self, step, trajectory):  # type: ignore[no-untyped-def]
        return 1.0 if step.call_index == len(trajectory.steps) - 1 else None


def test_plugin_scores_become_step_scores_keyed_and_timed_by_the_trajectory() -> None:
    [(topic, score)] = run(LastStepBonus())
    assert topic == "scores"
    assert (score["scorer"], score["episode_id"], score["call_index"], score["score"]) == (
        "last_step_bonus",
        "ep-r",
        2,
        1.0,
    )
    assert score["timestamp"].timestamp() * 1000 == 5_000


def test_an_abstaining_plugin_emits_one_nan_score_on_the_last_call() -> None:
    [(_, score)] = run(FunctionReward(lambda step, trajectory: None, name="silent"))
    assert (score["scorer"], score["call_index"], math.isnan(score["score"]), score["details_json"]) == (
        "silent", 2, True, '{"abstained": true}',
    )  # fmt: skip


def test_every_record_of_an_episode_carries_how_many_the_scorer_published_for_it() -> None:
    scored = run(FunctionReward(lambda step, trajectory: float(step.call_index), name="index"))
    assert [(topic, s["call_index"], s["episode_score_count"]) for topic, s in scored] == [
        ("scores", 0, 3), ("scores", 1, 3), ("scores", 2, 3),
    ]  # fmt: skip
    [(_, abstained)] = run(FunctionReward(lambda step, trajectory: None, name="silent"))
    assert (math.isnan(abstained["score"]), abstained["episode_score_count"]) == (True, 1)


def test_a_failing_plugin_dead_letters_the_trajectory() -> None:
    def broken(step, trajectory):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("oops")

    [(topic, letter)] = run(FunctionReward(broken))
    assert (topic, letter["error_type"], letter["consumer_group"]) == (
        "dead-letters",
        "ZeroDivisionError",
        "reward-broken",
    )
    assert "oops" in letter["reason"]


def test_builtin_names_and_module_paths_resolve() -> None:
    assert build_processor("assembler").name == "assembler"
    assert build_processor("consumers.assembler:TrajectoryAssembler").name == "assembler"
    assert build_processor("math:isnan").name == "reward-isnan"  # any plain function is a step reward
    try:
        build_processor("no-such-consumer")
    except UnknownConsumerError as exc:
        assert "no-such-consumer" in str(exc) and "assembler" in str(exc)
    else:
        raise AssertionError("an unknown name must fail")


def test_input_keeps_the_raw_bytes() -> None:
    assert Input("t", "S", {}, None, 0, 0, 0).value == b""
