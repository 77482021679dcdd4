"""The ``epochs`` and ``input`` options: more than one pass needs an end (``idle_exit_s`` on a stream, or a complete
input, which refuses idle settings); the pass, its position and its offsets survive a checkpoint's JSON."""

from __future__ import annotations

import pytest

from orchard.exceptions import ConfigError
from trainers.checkpoint import TrainerState
from trainers.config import load_trainer_config


def test_epochs_defaults_to_one_and_refuses_zero_naming_the_field() -> None:
    assert load_trainer_config().epochs == 1
    with pytest.raises(ConfigError, match="epochs"):
        load_trainer_config(None, ["epochs=0", "idle_exit_s=5"])


def test_more_than_one_epoch_needs_idle_exit_s_which_ends_the_first_pass_or_a_complete_input() -> None:
    with pytest.raises(ConfigError, match="epochs: 3 passes need idle_exit_s"):
        load_trainer_config(None, ["epochs=3"])
    assert load_trainer_config(None, ["epochs=3", "idle_exit_s=30"]).epochs == 3
    complete = load_trainer_config(None, ["epochs=3", "input=complete", "input_end={samples: {0: 40}}"])
    assert (complete.epochs, complete.input, complete.input_end, complete.order) == (
        3, "complete", {"samples": {0: 40}}, "shuffle"
    )  # fmt: skip


def test_a_complete_input_refuses_idle_settings_and_an_end_on_another_topic() -> None:
    with pytest.raises(ConfigError, match="idle_exit_s, idle_flush_s: not used with input: complete"):
        load_trainer_config(None, ["input=complete", "idle_flush_s=2", "idle_exit_s=30"])
    with pytest.raises(ConfigError, match="publish_on_idle: not used with input: complete"):
        load_trainer_config(None, ["input=complete", "publish_on_idle=true"])
    with pytest.raises(ConfigError, match="input_end: names other; this trainer reads only samples"):
        load_trainer_config(None, ["input=complete", "input_end={other: {0: 4}}"])
    with pytest.raises(ConfigError, match="input_end: only input: complete"):
        load_trainer_config(None, ["input_end={samples: {0: 4}}"])


def test_the_pass_and_the_stage_offsets_round_trip_through_the_checkpoint_json() -> None:
    state = TrainerState(
        7, 3, {"samples": {0: 12, 1: 4}}, epoch=2, epoch_start={"samples": {0: 5, 1: 0}}, epoch_end={"samples": {0: 20}}
    )
    assert TrainerState.from_json(state.to_json()) == state
    complete = TrainerState(9, 1, {"samples": {0: 5}}, epoch=1, epoch_start={"samples": {0: 5}},
                            epoch_end={"samples": {0: 40}}, pass_position=12)  # fmt: skip
    assert TrainerState.from_json(complete.to_json()) == complete


def test_a_checkpoint_written_before_epochs_existed_reads_as_the_first_pass() -> None:
    old = b'{"counters": {}, "numpy_rng": null, "offsets": {"samples": {"0": 9}}, "policy_version": 1, ' \
        b'"python_rng": null, "step": 4}'  # fmt: skip
    state = TrainerState.from_json(old)
    assert (state.offsets, state.epoch, state.epoch_start, state.epoch_end, state.pass_position) == (
        {"samples": {0: 9}}, 0, None, None, 0
    )  # fmt: skip
