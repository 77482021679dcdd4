"""Poison records go to the dead-letter topic with where they came from and why; the consumer carries on."""

from __future__ import annotations

import time

from orchard.bus.base import Producer, Record
from orchard.codec import Codec, DecodedRecord
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import DEAD_LETTERS

log = get_logger("bus.dead_letter")


class DeadLetterRouter:
    """Decodes records; anything undecodable, or of another schema than expected, is dead-lettered."""

    def __init__(
        self,
        producer: Producer,
        codec: Codec | None = None,
        *,
        topic: str = DEAD_LETTERS,
        consumer_group: str | None = None,
    ) -> None:
        self.producer = producer
        self.codec = codec or Codec.default()
        self.topic = topic
        self.consumer_group = consumer_group
        self.dead_lettered = 0

    def decode(self, record: Record, expected_schema: str | None = None) -> DecodedRecord | None:
        """Return the decoded record, or ``None`` after dead-lettering it with the reason."""
        try:
            decoded = self.codec.decode(record.value)
        except SerializationError as exc:
            self.send(record, str(exc), type(exc).__name__)
            return None
        if expected_schema is not None and decoded.name != expected_schema:
            reason = f"topic {record.topic!r} carries {expected_schema} records, got a {decoded.name}"
            self.send(record, reason, "SchemaMismatchError")
            return None
        return decoded

    def send(self, record: Record, reason: str, error_type: str) -> None:
        """Publish a ``DeadLetter`` for ``record`` (delivered with the producer's next flush)."""
        letter = {
            "original": record.value,
            "source_topic": record.topic,
            "source_partition": record.partition,
            "source_offset": record.offset,
            "source_key": record.key,
            "reason": reason,
            "error_type": error_type,
            "consumer_group": self.consumer_group,
            "timestamp": int(time.time() * 1000),
        }
        self.producer.produce(self.topic, self.codec.encode("DeadLetter", letter), key=record.key)
        self.dead_lettered += 1
        log.warning(
            "dead-lettered record",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error_type=error_type,
            reason=reason[:200],
        )
