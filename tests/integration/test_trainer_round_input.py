"""Lockstep rounds (``input: rounds``): a round is trained whole, in key order, whatever the timing of its samples.

- the same rounds delivered in two bus orders, one all at once and one slowly with the round's samples shuffled,
  give the same steps and bitwise the same weights after every round (tiny model, CPU, deterministic torch);
- every announced round gets exactly one version, tagged with the round, an empty round included;
- a trainer stopped between rounds and started again skips the rounds it trained and continues with the next;
- a sample that arrives after its round was announced is trained with the next round, not lost;
- with ``epochs: 2`` each round's samples are trained twice, in the same order, before its one version;
- rows of one sample (``row_tokens: 1``, or ``layout: padded``) train the same steps to the same weights (within
  float rounding).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchard.bus import open_bus
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.store import open_store
from orchard.topics import POLICY_VERSIONS, ROLLOUT_ROUNDS
from tests.integration.test_trainer_complete_input import RecordingTrainer, _orchard
from trainers.checkpoint import CheckpointStore
from trainers.config import PolicyTrainerConfig
from trainers.synthetic import produce_samples, synthetic_stream

MODEL = "tiny-llama-micro"
TINY_VOCAB = 420
PER_ROUND = 10  # 40 tokens each, 4 a step (batch_tokens=160): 3 steps a round, the last of 2 samples


def _config(root: Path, **overrides: Any) -> PolicyTrainerConfig:
    base: dict[str, Any] = {
        "model": {"type": "tiny", "name": MODEL, "seed": 1},
        "run_dir": root / "run",
        "input": "rounds",
        "loss": {"kind": "rl"},
        "batch_tokens": 160,
        "lr": 1e-3,
        "poll_timeout_s": 0.05,
        "deterministic": True,
        "cpu_threads": 1,
        "seed": 3,
    }
    return PolicyTrainerConfig.model_validate(base | overrides)


def _round_samples(round_index: int) -> list[dict[str, Any]]:
    records = synthetic_stream(PER_ROUND, run_id="r1", vocab_size=TINY_VOCAB, lengths=(40,), seed=10 + round_index)
    for record in records:
        record["group_id"] = f"r{round_index:06d}-{record['group_id']}"
    return records


def _announce(bus_path: Path, round_index: int) -> None:
    """What a lockstep rollout says once the round's samples are all on the topic: where they end, now."""
    with open_bus(EmbeddedBusConfig(path=bus_path)) as bus, bus.producer() as producer:
        bus.create_topic(ROLLOUT_ROUNDS, 1, exist_ok=True)
        bus.create_topic("samples", 1, exist_ok=True)
        ends = bus.describe_topic("samples").end_offsets
        record = {"run_id": "r1", "round": round_index, "episodes": PER_ROUND, "group_ids": [],
                  "policy_version": None, "complete": True, "samples_topic": "samples",
                  "samples_end_offsets": [ends[p] for p in sorted(ends)], "created_at": now_ms()}  # fmt: skip
        producer.send(ROLLOUT_ROUNDS, Codec.default().encode("RolloutRound", record), key=b"r1")


def _versions(bus_path: Path) -> list[dict[str, Any]]:
    with open_bus(EmbeddedBusConfig(path=bus_path)) as bus:
        bus.create_topic(POLICY_VERSIONS, 1, exist_ok=True)
        with bus.consumer([POLICY_VERSIONS], group=None, start="earliest") as consumer:
            records = consumer.poll(max_records=100, timeout_s=0.5)
    return [Codec.default().decode(r.value).record for r in records]


def _tags(bus_path: Path) -> list[int]:
    return [int(v["metrics"]["rollout_round"]) for v in _versions(bus_path) if "rollout_round" in v["metrics"]]


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _weights(root: Path) -> dict[str, torch.Tensor]:
    with open_store(LocalStoreConfig(path=root / "store")) as store:
        checkpoint = CheckpointStore(store, "r1", "policy", root / "scratch").load_latest()
    assert checkpoint is not None
    return checkpoint.tensors["model"]


def _run_rounds(
    root: Path, rounds: list[list[dict[str, Any]]], *, shuffle: bool, first: int = 0, **settings: Any
) -> RecordingTrainer:
    """Deliver each round's samples (shuffled, in two parts, if asked), announce it (as round ``first`` + its
    index), wait for its version; then drain the trainer."""
    trainer = RecordingTrainer(_config(root, **settings), _orchard(root))
    runner = threading.Thread(target=trainer.run, daemon=True)
    runner.start()
    order = np.random.default_rng(5)
    for index, records in enumerate(rounds):
        records = [records[int(i)] for i in order.permutation(len(records))] if shuffle else records
        parts = (records[: len(records) // 2], records[len(records) // 2 :]) if shuffle else (records,)
        for part in parts:
            with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
                produce_samples(bus, "samples", part)
        _announce(root / "bus", first + index)
        _wait(lambda: _tags(root / "bus")[-1:] == [first + index], 120, f"round {first + index}'s version")  # noqa: B023
    trainer.request_drain()
    runner.join(timeout=120)
    assert not runner.is_alive()
    return trainer


def test_rounds_in_two_bus_orders_give_the_same_steps_and_weights_and_one_tagged_version_per_round(
    tmp_path: Path,
) -> None:
    rounds = [_round_samples(0), _round_samples(1), []]  # the third round taught nothing: still a version
    first = _run_rounds(tmp_path / "a", rounds, shuffle=False)
    second = _run_rounds(tmp_path / "b", rounds, shuffle=True)

    assert first.batches == second.batches and len(first.batches) == 6
    for versions in (_versions(tmp_path / "a" / "bus"), _versions(tmp_path / "b" / "bus")):
        assert [(v["version"], v["metrics"]["rollout_round"], v["trainer_step"]) for v in versions] == [
            (1, 0.0, 3), (2, 1.0, 6), (3, 2.0, 6)
        ]  # fmt: skip
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_restarted_trainer_skips_the_rounds_it_trained_even_an_empty_last_one_and_trains_the_next(
    tmp_path: Path,
) -> None:
    """Round 1 gave nothing to train (no step): its checkpoint must still say so, or a restart would train round 2's
    samples as round 1's and publish a version number twice."""
    _run_rounds(tmp_path / "once", [_round_samples(0), [], _round_samples(2)], shuffle=False)
    root = tmp_path / "twice"
    _run_rounds(root, [_round_samples(0), []], shuffle=False)
    again = _run_rounds(root, [_round_samples(2)], shuffle=False, first=2)

    assert len(again.batches) == 3  # round 2's steps only: rounds 0 and 1 were read again and skipped
    for bus in (tmp_path / "once" / "bus", root / "bus"):
        assert [(v["version"], v["metrics"]["rollout_round"]) for v in _versions(bus)] == [(1, 0.0), (2, 1.0), (3, 2.0)]
    once, twice = _weights(tmp_path / "once"), _weights(root)
    assert all(torch.equal(once[name], twice[name]) for name in once)


@pytest.mark.parametrize("max_steps", [2, 3])
def test_max_steps_is_looked_at_between_rounds_the_round_that_reaches_it_is_trained_whole_and_tagged(
    tmp_path: Path, max_steps: int
) -> None:
    trainer = RecordingTrainer(_config(tmp_path, max_steps=max_steps), _orchard(tmp_path))
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        produce_samples(bus, "samples", _round_samples(0))
    _announce(tmp_path / "bus", 0)
    summary = trainer.run()  # returns by itself: max_steps reached at the round's end

    assert (summary.steps, len(trainer.batches)) == (3, 3)
    assert [(v["version"], v["metrics"].get("rollout_round")) for v in _versions(tmp_path / "bus")] == [(1, 0.0)]
    with open_store(LocalStoreConfig(path=tmp_path / "store")) as store:
        checkpoint = CheckpointStore(store, "r1", "policy", tmp_path / "scratch").load_latest()
    assert checkpoint is not None and (checkpoint.state.round, checkpoint.state.offsets) == (0, {"samples": {0: 10}})


def test_a_sample_that_comes_after_its_round_was_announced_is_trained_with_the_next_round(tmp_path: Path) -> None:
    root = tmp_path
    trainer = RecordingTrainer(_config(root), _orchard(root))
    runner = threading.Thread(target=trainer.run, daemon=True)
    runner.start()
    late, *rest = _round_samples(0)
    with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
        produce_samples(bus, "samples", rest)
    _announce(root / "bus", 0)
    _wait(lambda: len(_versions(root / "bus")) == 1, 120, "round 0's version")
    with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
        produce_samples(bus, "samples", [late, *_round_samples(1)])
    _announce(root / "bus", 1)
    _wait(lambda: len(_versions(root / "bus")) == 2, 120, "round 1's version")
    trainer.request_drain()
    runner.join(timeout=120)

    trained = [sample for batch in trainer.batches for sample in batch]
    assert len(trained) == 2 * PER_ROUND and len(set(trained)) == 2 * PER_ROUND
    assert late["sample_id"] in [sample for batch in trainer.batches[3:] for sample in batch]


@pytest.mark.parametrize("behaviour", ["sampled", "trainer"])
def test_with_the_trainers_own_logprobs_engine_rounding_in_the_samples_changes_no_weight(
    tmp_path: Path, behaviour: str
) -> None:
    """Two engines that batched their requests differently report the same tokens with logprobs a few 1e-6 apart (two
    file-lookup runs did). With ``behaviour_logprobs: trainer`` the ratio's old logprobs are the trainer's own, so
    the weights come out bitwise the same; with the sampled ones they do not."""
    from orchard.tokens import pack_logprobs, unpack_logprobs

    def nudged(records: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
        rng = np.random.default_rng(seed)
        out = []
        for record in records:
            values = unpack_logprobs(record["behaviour_logprobs"])
            noise = (rng.normal(0.0, 3e-6, size=values.shape) * (values != 0)).astype(np.float32)
            out.append({**record, "behaviour_logprobs": pack_logprobs(values + noise)})
        return out

    rounds = [_round_samples(0), _round_samples(1)]
    settings = {"loss": {"kind": "rl", "behaviour_logprobs": behaviour}}
    for name, seed in (("a", 1), ("b", 2)):
        _run_rounds(tmp_path / name, [nudged(records, seed) for records in rounds], shuffle=False, **settings)
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(a[name], b[name]) for name in a) == (behaviour == "trainer")


def test_two_epochs_train_each_rounds_samples_twice_in_the_same_order_before_its_one_version(tmp_path: Path) -> None:
    once = _run_rounds(tmp_path / "once", [_round_samples(0), _round_samples(1)], shuffle=False)
    twice = _run_rounds(tmp_path / "twice", [_round_samples(0), _round_samples(1)], shuffle=True, epochs=2)

    first, second = once.batches[:3], once.batches[3:]
    assert twice.batches == first + first + second + second
    versions = _versions(tmp_path / "twice" / "bus")
    tagged = [(v["version"], v["metrics"]["rollout_round"], v["trainer_step"]) for v in versions]
    assert tagged == [(1, 0.0, 6), (2, 1.0, 12)]


@pytest.mark.parametrize("layout", [{"row_tokens": 1}, {"layout": "padded"}], ids=["rows-of-one", "padded"])
def test_rows_of_one_sample_train_the_same_steps_to_the_same_weights_as_one_packed_row(
    tmp_path: Path, layout: dict[str, Any]
) -> None:
    packed = _run_rounds(tmp_path / "packed", [_round_samples(0), _round_samples(1)], shuffle=False)
    single = _run_rounds(tmp_path / "single", [_round_samples(0), _round_samples(1)], shuffle=False, **layout)

    assert single.batches == packed.batches
    assert [len(row) for row in packed.rows] == [4, 4, 2] * 2  # 160 tokens a row: a step of 4 samples in one
    if "row_tokens" in layout:
        assert single.rows == [[sample] for step in packed.batches for sample in step]
    else:  # padded batches of several samples (one row each), every sample trained once
        assert max(len(rows) for rows in single.rows) >= 2
        assert sorted(s for rows in single.rows for s in rows) == sorted(s for step in packed.batches for s in step)
    a, b = _weights(tmp_path / "packed"), _weights(tmp_path / "single")
    for name in a:  # the same gradients, summed in another order (6 AdamW steps of lr 1e-3 move weights ~6e-3)
        torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-4)
    assert any(not torch.equal(a[name], b[name]) for name in a)  # it did train in other rows


class BehaviourRecordingTrainer(RecordingTrainer):
    """Also records the behaviour logprobs each step trained with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.behaviour: list[list[np.ndarray]] = []

    def _train(self, step: Any) -> None:
        self.behaviour.append([np.array(s.behaviour_logprobs, copy=True) for s in step.samples])
        super()._train(step)


def test_every_epoch_of_a_round_trains_with_the_trainers_logprobs_from_the_rounds_start(tmp_path: Path) -> None:
    """The second pass's behaviour logprobs are the relabelled ones of the first (the weights the round was sampled
    with), not the sample's own and not the weights after the first pass."""
    root = tmp_path
    trainer = BehaviourRecordingTrainer(
        _config(root, epochs=2, loss={"kind": "rl", "behaviour_logprobs": "trainer"}), _orchard(root)
    )
    runner = threading.Thread(target=trainer.run, daemon=True)
    runner.start()
    records = _round_samples(0)
    with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
        produce_samples(bus, "samples", records)
    _announce(root / "bus", 0)
    _wait(lambda: _tags(root / "bus") == [0], 120, "round 0's version")
    trainer.request_drain()
    runner.join(timeout=120)

    from orchard.tokens import unpack_logprobs

    assert len(trainer.behaviour) == 6 and trainer.batches[:3] == trainer.batches[3:]
    first, second = trainer.behaviour[:3], trainer.behaviour[3:]
    assert all(
        np.array_equal(a, b)
        for step_a, step_b in zip(first, second, strict=True)
        for a, b in zip(step_a, step_b, strict=True)
    )
    sampled = {r["sample_id"]: unpack_logprobs(r["behaviour_logprobs"]) for r in records}
    relabelled = dict(zip(trainer.batches[0], first[0], strict=True))
    assert not any(np.array_equal(sampled[sample_id], values) for sample_id, values in relabelled.items())
