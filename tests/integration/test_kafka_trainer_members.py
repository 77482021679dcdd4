"""Policy trainers on a real Kafka broker: their consumer groups come from the run and the model, and a trainer fenced
by another process with its static instance id exits with an error instead of waiting forever."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from orchard.bus import BusError, open_bus
from orchard.config import KafkaBusConfig, LocalStoreConfig, OrchardConfig
from orchard.store import open_store
from trainers.config import PolicyTrainerConfig
from trainers.policy import PolicyTrainer
from trainers.synthetic import produce_samples, synthetic_stream

TINY_VOCAB = 420


def _members(bootstrap: str, group: str) -> list[str | None]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return [member.group_instance_id for member in described.members]


@pytest.mark.kafka
@pytest.mark.slow
def test_a_trainer_fenced_by_a_second_process_with_its_instance_id_exits_with_an_error(
    tmp_path: Path, kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("samples")
    orchard = OrchardConfig(
        run_id=run_id, bus=KafkaBusConfig(bootstrap_servers=kafka_bootstrap), store=LocalStoreConfig(path=tmp_path)
    )
    config = PolicyTrainerConfig(
        run_dir=tmp_path / "run", topic=topic, batch_tokens=1024, idle_flush_s=0.2, poll_timeout_s=0.1, cpu_threads=1
    )
    group, instance = config.consumer_group(run_id), config.static_instance_id(run_id)
    bus, store = open_bus(orchard.bus), open_store(orchard.store)
    produce_samples(bus, topic, synthetic_stream(2, run_id=run_id, vocab_size=TINY_VOCAB, lengths=(40,)))
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            outcome["summary"] = PolicyTrainer(config, orchard, bus=bus, store=store).run()
        except BusError as exc:
            outcome["error"] = exc

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    intruder = None
    try:
        deadline = time.monotonic() + 120
        while _members(kafka_bootstrap, group) != [instance] and time.monotonic() < deadline:
            time.sleep(0.5)
        intruder = bus.consumer([topic], group, instance_id=instance)  # a second trainer with the same identity
        intruder.poll(timeout_s=1.0)
        trainer.join(timeout=60)
    finally:
        if intruder is not None:
            intruder.close()
    alive = trainer.is_alive()
    bus.close()
    store.close()
    assert (group, instance) == (f"{run_id}.policy-trainer.policy", f"{run_id}.policy-trainer.policy.0")
    assert not alive, "the fenced trainer is still running"
    assert "summary" not in outcome
    assert f"consumer of group {group!r} was fenced" in str(outcome["error"])
    assert f"group.instance.id {instance!r}" in str(outcome["error"])
