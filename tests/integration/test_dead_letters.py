"""Poison records reach the dead-letter topic with their origin and reason, on both backends; good ones pass."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from orchard.bus import Bus
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.codec import Codec


def outcome(episode: str) -> dict[str, object]:
    """A valid EpisodeOutcome."""
    now = int(time.time() * 1000)
    return {
        "run_id": "run",
        "episode_id": episode,
        "task_id": "task",
        "group_id": "group",
        "status": "SUCCEEDED",
        "reward": 1.0,
        "success": True,
        "signals": {"tests_passed": 1.0},
        "num_model_calls": 3,
        "started_at": now - 1000,
        "ended_at": now,
    }


def test_poison_records_are_dead_lettered_and_the_consumer_carries_on(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    codec = Codec.default()
    source, dead = unique_name("outcomes"), unique_name("dead")
    bus.create_topic(source, partitions=1)
    bus.create_topic(dead, partitions=1)
    good = codec.encode("EpisodeOutcome", outcome("e1"))
    unknown_fingerprint = b"\xc3\x01" + struct.pack("<Q", 0x1234) + good[10:]
    wrong_schema = codec.encode(
        "PolicyVersion",
        {
            "run_id": "run",
            "model": "m",
            "version": 1,
            "uri": "u",
            "sha256": "0" * 64,
            "trainer_step": 1,
            "created_at": 0,
        },
    )
    poison = {
        b"corrupt": (b"\x00\x01not avro at all", "CorruptRecordError"),
        b"unknown": (unknown_fingerprint, "UnknownFingerprintError"),
        b"truncated": (good[:-5], "CorruptRecordError"),
        b"wrong": (wrong_schema, "SchemaMismatchError"),
    }
    producer = bus.producer()
    producer.produce(source, good, key=b"good-1")
    for key, (value, _) in poison.items():
        producer.produce(source, value, key=key)
    producer.produce(source, codec.encode("EpisodeOutcome", outcome("e2")), key=b"good-2")
    producer.flush()

    router = DeadLetterRouter(bus.producer(), codec, topic=dead, consumer_group="assembler")
    consumer = bus.consumer([source])
    decoded = []
    while batch := consumer.poll(max_records=100, timeout_s=2.0):
        for record in batch:
            result = router.decode(record, expected_schema="EpisodeOutcome")
            if result is not None:
                decoded.append(result.record["episode_id"])
    router.producer.flush()
    assert decoded == ["e1", "e2"]
    assert router.dead_lettered == 4

    letters = []
    reader = bus.consumer([dead])
    while batch := reader.poll(max_records=100, timeout_s=2.0):
        letters.extend(codec.decode(r.value).record for r in batch)
    assert [(letter["source_key"], letter["error_type"]) for letter in letters] == [
        (key, error_type) for key, (_, error_type) in poison.items()
    ]
    assert [letter["original"] for letter in letters] == [value for value, _ in poison.values()]
    assert [(letter["source_topic"], letter["source_partition"]) for letter in letters] == [(source, 0)] * 4
    assert [letter["source_offset"] for letter in letters] == [1, 2, 3, 4]
    assert all(letter["reason"] and letter["consumer_group"] == "assembler" for letter in letters)
    assert "fingerprint 3412000000000000" in letters[1]["reason"]


def test_a_poison_record_at_the_size_limit_still_fits_in_a_cut_letter(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    codec = Codec.default()
    source, dead = unique_name("big"), unique_name("dead")
    bus.create_topic(source, partitions=1)
    bus.create_topic(dead, partitions=1, config={"max.message.bytes": "50000"})
    poison = b"\x00" * 48_000
    bus.producer().send(source, poison)
    router = DeadLetterRouter(bus.producer(), codec, topic=dead)
    [record] = bus.consumer([source]).poll(max_records=1, timeout_s=5.0)
    assert router.decode(record) is None
    router.flush()
    [letter] = [codec.decode(r.value).record for r in bus.consumer([dead]).poll(max_records=1, timeout_s=5.0)]
    assert letter["original"] == poison[: len(letter["original"])]
    assert 0 < len(letter["original"]) < len(poison)
    assert f"original cut from {len(poison)} to {len(letter['original'])} bytes" in letter["reason"]
