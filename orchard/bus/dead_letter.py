"""Poison records go to the dead-letter topic with where they came from and why; the consumer carries on."""

from __future__ import annotations

from orchard.bus.base import Producer, Record
from orchard.clock import now_ms
from orchard.codec import Codec, DecodedRecord
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import DEAD_LETTERS

log = get_logger("bus.dead_letter")
LETTER_OVERHEAD_BYTES = 4096  # room for the letter's other fields: topic, key, reason, group


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
        """Publish a ``DeadLetter`` for ``record``; call ``flush`` before committing the source offsets.

        An original too large to fit in a letter is cut to fit (the reason says so), so a poison record close to
        the size limit can never block its consumer.
        """
        room = self.producer.record_limit(self.topic)[0] - LETTER_OVERHEAD_BYTES - len(reason)
        original = record.value
        if len(original) > room:
            reason = f"{reason} [original cut from {len(original)} to {max(room, 0)} bytes to fit the letter]"
            original = original[: max(room, 0)]
        letter = {
            "original": original,
            "source_topic": record.topic,
            "source_partition": record.partition,
            "source_offset": record.offset,
            "source_key": record.key,
            "reason": reason,
            "error_type": error_type,
            "consumer_group": self.consumer_group,
            "timestamp": now_ms(),
        }
        key = record.key if record.key is None or len(record.key) < 1024 else record.key[:1024]
        self.producer.produce(self.topic, self.codec.encode("DeadLetter", letter), key=key)
        self.dead_lettered += 1
        log.warning(
            "dead-lettered record",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error_type=error_type,
            reason=reason[:200],
        )

    def flush(self) -> None:
        """Wait until every letter sent so far is acknowledged (before the source offsets are committed)."""
        self.producer.flush()
