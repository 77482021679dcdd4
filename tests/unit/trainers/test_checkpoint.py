"""Trainer checkpoints in a local store: state and offsets round-trip, RNG states restore, old ones are removed."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from orchard.config import LocalStoreConfig
from orchard.store import open_store
from trainers.checkpoint import CheckpointStore, TrainerState, capture_rng, restore_rng


def test_state_round_trips_through_json_with_integer_partitions() -> None:
    state = TrainerState(7, 3, {"samples": {0: 12, 3: 40}}, {"samples": 9.0}, None, None)
    assert TrainerState.from_json(state.to_json()) == state


def test_rng_states_restore_every_generator() -> None:
    tensors, python_rng, numpy_rng = capture_rng()
    expected = (random.random(), np.random.random(), torch.rand(1).item())  # noqa: S311, NPY002
    restore_rng(tensors, python_rng, numpy_rng)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected  # noqa: S311, NPY002


def test_checkpoints_save_load_and_keep_the_newest(tmp_path: Path) -> None:
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    checkpoints = CheckpointStore(store, "r1", "policy", tmp_path / "scratch", keep=2)
    assert checkpoints.load_latest() is None
    for step in (5, 10, 15):
        state = TrainerState(step, step // 5, {"samples": {0: step * 4}})
        assert checkpoints.save({"model": {"w": torch.full((2,), float(step))}}, state)
    assert not checkpoints.save({"model": {}}, TrainerState(15, 3, {}))  # the same step again: kept as it was
    loaded = checkpoints.load_latest()
    assert loaded is not None
    assert loaded.state == TrainerState(15, 3, {"samples": {0: 60}})
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((2,), 15.0))
    assert store.list_versions(checkpoints.name) == [10, 15]
