"""The ``epochs`` option: bounded and tied to ``idle_exit_s``; the pass and its offsets survive a checkpoint's JSON."""

from __future__ import annotations

import pytest

from orchard.exceptions import ConfigError
from trainers.checkpoint import TrainerState
from trainers.config import load_trainer_config


def test_epochs_defaults_to_one_and_refuses_zero_naming_the_field() -> None:
    assert load_trainer_config().epochs == 1
    with pytest.raises(ConfigError, match="epochs"):
        load_trainer_config(None, ["epochs=0", "idle_exit_s=5"])


def test_more_than_one_epoch_needs_idle_exit_s_which_ends_the_first_pass() -> None:
    with pytest.raises(ConfigError, match="epochs: 3 passes need idle_exit_s"):
        load_trainer_config(None, ["epochs=3"])
    assert load_trainer_config(None, ["epochs=3", "idle_exit_s=30"]).epochs == 3


def test_the_pass_and_the_stage_offsets_round_trip_through_the_checkpoint_json() -> None:
    state = TrainerState(
        7, 3, {"samples": {0: 12, 1: 4}}, epoch=2, epoch_start={"samples": {0: 5, 1: 0}}, epoch_end={"samples": {0: 20}}
    )
    assert TrainerState.from_json(state.to_json()) == state


def test_a_checkpoint_written_before_epochs_existed_reads_as_the_first_pass() -> None:
    old = b'{"counters": {}, "numpy_rng": null, "offsets": {"samples": {"0": 9}}, "policy_version": 1, ' \
        b'"python_rng": null, "step": 4}'  # fmt: skip
    state = TrainerState.from_json(old)
    assert (state.offsets, state.epoch, state.epoch_start, state.epoch_end) == ({"samples": {0: 9}}, 0, None, None)
