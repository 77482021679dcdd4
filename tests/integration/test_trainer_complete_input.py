"""A complete input (``input: complete``): what a stage trains does not depend on when or in what order it arrived.

- the same samples delivered in two bus orders, one all at once before the trainer starts and one slowly while it
  waits (with pauses longer than any idle setting), give the same batches, the same number of steps (samples,
  epochs and batch size decide it) and bitwise the same weights (tiny model, CPU, deterministic torch, fixed seed);
- a trainer stopped mid-pass resumes that pass at the same sample and ends with the same weights;
- a sample delivered twice trains once; the next stage's trainer starts after the stage's samples;
- on a stream, a step's samples are sorted by key before they are packed: the same step in another arrival order
  gives the same weights;
- on Kafka, a complete input written through transactions (a marker after each record) is read to its end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, KafkaBusConfig, LocalStoreConfig, OrchardConfig
from orchard.store import open_store
from trainers.checkpoint import CheckpointStore
from trainers.config import PolicyTrainerConfig
from trainers.policy import PolicyTrainer, _Step
from trainers.synthetic import produce_samples, synthetic_stream

MODEL = "tiny-llama-micro"
TINY_VOCAB = 420
SAMPLES = 22  # 40 tokens each, 4 a step (batch_tokens=160): 6 steps a pass, the last one of 2 samples


class RecordingTrainer(PolicyTrainer):
    """A policy trainer that records the sample ids of every step it trains, and of every row it packs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[str]] = []
        self.rows: list[list[str]] = []

    def _train(self, step: _Step) -> None:
        self.batches.append([s.sample_id for s in step.samples])
        super()._train(step)

    def _micro_batch(self, batch: Any, normalizer: float) -> Any:
        self.rows.append(list(batch.sample_ids))
        return super()._micro_batch(batch, normalizer)


def _orchard(root: Path) -> OrchardConfig:
    return OrchardConfig(
        run_id="r1", bus=EmbeddedBusConfig(path=root / "bus"), store=LocalStoreConfig(path=root / "store")
    )


def _config(root: Path, **overrides: Any) -> PolicyTrainerConfig:
    base: dict[str, Any] = {
        "model": {"type": "tiny", "name": MODEL, "seed": 1},
        "run_dir": root / "run",
        "input": "complete",
        "loss": {"kind": "sft"},
        "batch_tokens": 160,
        "lr": 1e-3,
        "epochs": 2,
        "publish_every": 100,
        "checkpoint_every": 100,
        "poll_timeout_s": 0.05,
        "deterministic": True,
        "cpu_threads": 1,
        "seed": 3,
    }
    return PolicyTrainerConfig.model_validate(base | overrides)


def _stream(seed: int = 2) -> list[dict[str, Any]]:
    return synthetic_stream(SAMPLES, run_id="r1", kinds=("SFT",), vocab_size=TINY_VOCAB, lengths=(40,), seed=seed)


def _deliver_slowly(bus_path: Path, records: list[dict[str, Any]], pause_s: float) -> threading.Thread:
    """Produce ``records`` one by one from another thread, with a long pause halfway (longer than any idle flush)."""

    def deliver() -> None:
        with open_bus(EmbeddedBusConfig(path=bus_path)) as bus:
            for index, record in enumerate(records):
                time.sleep(pause_s * 10 if index == len(records) // 2 else pause_s)
                produce_samples(bus, "samples", [record])

    thread = threading.Thread(target=deliver, name="slow-delivery")
    thread.start()
    return thread


def _final_weights(root: Path) -> dict[str, torch.Tensor]:
    saved = CheckpointStore(open_store(LocalStoreConfig(path=root / "store")), "r1", "policy", root / "s").load_latest()
    assert saved is not None
    return dict(saved.tensors["model"])


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(b[key], tensor), key


@pytest.mark.parametrize("order", ["key", "shuffle"])
def test_two_bus_orders_one_delivered_slowly_give_the_same_batches_steps_and_weights(
    tmp_path: Path, order: str
) -> None:
    stream = _stream()
    shuffled = [*stream[1::2], *stream[::2][::-1]]  # another bus order of the same samples
    assert [r["sample_id"] for r in shuffled] != [r["sample_id"] for r in stream]

    at_once, slow = tmp_path / "at-once", tmp_path / "slow"
    with open_bus(EmbeddedBusConfig(path=at_once / "bus")) as bus:
        produce_samples(bus, "samples", stream)
    first = RecordingTrainer(_config(at_once, order=order), _orchard(at_once))
    first_summary = first.run()

    with open_bus(EmbeddedBusConfig(path=slow / "bus")) as bus:
        bus.create_topic("samples", 1, exist_ok=True)
    delivery = _deliver_slowly(slow / "bus", shuffled, pause_s=0.03)
    config = _config(slow, order=order, input_end={"samples": {0: SAMPLES}})  # the stage's end, known in advance
    second = RecordingTrainer(config, _orchard(slow))
    second_summary = second.run()
    delivery.join()

    assert len(first.batches) == 2 * 6  # 2 passes of ceil(22 / 4) steps, whatever the timing
    assert second.batches == first.batches
    assert [len(batch) for batch in first.batches] == [4, 4, 4, 4, 4, 2] * 2
    passes = [sorted(sum(first.batches[i * 6 : (i + 1) * 6], [])) for i in range(2)]
    assert passes[0] == passes[1] == sorted(r["sample_id"] for r in stream)  # every sample once a pass
    if order == "shuffle":
        assert first.batches[:6] != first.batches[6:]  # each pass has an order of its own
    assert (first_summary.steps, first_summary.epochs, first_summary.offsets) == (12, 2, {"samples": {0: SAMPLES}})
    assert (second_summary.steps, second_summary.epochs, second_summary.offsets) == (12, 2, {"samples": {0: SAMPLES}})
    _assert_same_weights(_final_weights(at_once), _final_weights(slow))


class _Crash(Exception):
    """Stands for the process dying in the middle of a step."""


def test_a_trainer_stopped_mid_pass_resumes_at_the_same_sample_with_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = _stream(seed=4)
    ends = {}
    for name in ("uninterrupted", "crashed"):
        root = tmp_path / name
        with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
            produce_samples(bus, "samples", stream)
        config = _config(root, checkpoint_every=1)
        if name == "crashed":

            def crash_at_step_9(self: PolicyTrainer, step: Any, train: Any = PolicyTrainer._train) -> None:
                if self.step == 8:  # in the second pass, after its second step's checkpoint
                    raise _Crash
                train(self, step)

            monkeypatch.setattr(PolicyTrainer, "_train", crash_at_step_9)
            with pytest.raises(_Crash):
                PolicyTrainer(config, _orchard(root)).run()
            monkeypatch.undo()
            store = open_store(LocalStoreConfig(path=root / "store"))
            saved = CheckpointStore(store, "r1", "policy", root / "s").load_latest()
            assert saved is not None
            state = saved.state
            assert (state.step, state.epoch, state.pass_position, state.offsets) == (8, 1, 8, {"samples": {0: 0}})
            assert (state.epoch_start, state.epoch_end) == ({"samples": {0: 0}}, {"samples": {0: SAMPLES}})
        summary = PolicyTrainer(config, _orchard(root)).run()
        assert (summary.steps, summary.offsets) == (12, {"samples": {0: SAMPLES}})
        ends[name] = _final_weights(root)
    _assert_same_weights(ends["uninterrupted"], ends["crashed"])


def test_a_duplicate_trains_once_and_the_next_stage_starts_after_the_stage_s_samples(tmp_path: Path) -> None:
    orchard = _orchard(tmp_path)
    stream = _stream()
    other_run = synthetic_stream(1, run_id="r2", kinds=("SFT",), vocab_size=TINY_VOCAB, lengths=(40,), seed=8)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", [*stream[:10], stream[3], *other_run, *stream[10:]])  # 24 records
    trainer = RecordingTrainer(_config(tmp_path, epochs=1), orchard)
    summary = trainer.run()
    assert sorted(sum(trainer.batches, [])) == sorted(r["sample_id"] for r in stream)
    assert (summary.steps, summary.samples, summary.offsets) == (6, SAMPLES, {"samples": {0: 24}})
    end = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
    assert end is not None  # between stages: pass 0, no pass position, offsets at the end of the stage's samples
    assert (end.state.epoch, end.state.epoch_start, end.state.epoch_end, end.state.pass_position) == (0, None, None, 0)

    later = synthetic_stream(5, run_id="r1", kinds=("SFT",), vocab_size=TINY_VOCAB, lengths=(40,), seed=9)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", later)
    following = RecordingTrainer(_config(tmp_path, epochs=1, run_dir=tmp_path / "run2"), orchard)
    summary = following.run()
    assert sorted(sum(following.batches, [])) == sorted(r["sample_id"] for r in later)
    assert (summary.resumed_from_step, summary.steps, summary.offsets) == (6, 8, {"samples": {0: 29}})


def test_on_a_stream_a_step_in_another_arrival_order_gives_the_same_weights(tmp_path: Path) -> None:
    stream = synthetic_stream(8, run_id="r1", kinds=("RL", "SFT"), vocab_size=TINY_VOCAB, lengths=(40,), seed=6)
    orders = {"arrival": stream, "reversed-within-steps": [*stream[3::-1], *stream[:3:-1]]}
    weights, batches = {}, {}
    for name, records in orders.items():
        root = tmp_path / name
        with open_bus(EmbeddedBusConfig(path=root / "bus")) as bus:
            produce_samples(bus, "samples", records)
        stream_config = {"input": "stream", "loss": {"kind": "auto"}, "epochs": 1, "max_steps": 2, "idle_flush_s": 3600}
        trainer = RecordingTrainer(_config(root, **stream_config), _orchard(root))
        trainer.run()
        weights[name], batches[name] = _final_weights(root), trainer.batches
    assert batches["arrival"] == batches["reversed-within-steps"]
    assert batches["arrival"][0] == sorted(r["sample_id"] for r in stream[:4])
    _assert_same_weights(weights["arrival"], weights["reversed-within-steps"])


def test_the_metrics_of_a_complete_stage_count_each_pass(tmp_path: Path) -> None:
    orchard = _orchard(tmp_path)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", _stream())
    PolicyTrainer(_config(tmp_path, max_steps=8), orchard).run()  # max_steps ends the stage in its second pass
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["samples"] for m in metrics] == [4, 4, 4, 4, 4, 2, 4, 4]
    end = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
    assert end is not None and (end.state.step, end.state.offsets, end.state.epoch_end) == (
        8,
        {"samples": {0: 22}},
        None,
    )


@pytest.mark.kafka
def test_on_kafka_a_complete_input_is_read_to_its_end_past_transaction_markers(
    tmp_path: Path, kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("samples")
    orchard = OrchardConfig(
        run_id=run_id, bus=KafkaBusConfig(bootstrap_servers=kafka_bootstrap), store=LocalStoreConfig(path=tmp_path)
    )
    records = synthetic_stream(6, run_id=run_id, kinds=("SFT",), vocab_size=TINY_VOCAB, lengths=(40,), seed=5)
    codec = Codec.default()
    bus = open_bus(orchard.bus)
    try:
        bus.create_topic(topic, 2)
        writer = bus.transactional_producer(unique_name("builder"))
        for record in records:  # one transaction each, as a sample builder commits: a marker after each
            writer.begin()
            writer.produce(topic, codec.encode("TrainingSample", record), record["episode_id"].encode())
            writer.commit()
        writer.close()
        config = _config(tmp_path, topic=topic, group_id=unique_name("trainer"), epochs=1, order="key")
        trainer = RecordingTrainer(config, orchard, bus=bus)
        summary = trainer.run()
        ends = bus.describe_topic(topic).end_offsets
    finally:
        bus.close()
    assert [sorted(batch) for batch in trainer.batches] == [sorted(r["sample_id"] for r in records)[:4],
                                                           sorted(r["sample_id"] for r in records)[4:]]  # fmt: skip
    assert summary.steps == 2 and summary.offsets == {topic: dict(ends)}
