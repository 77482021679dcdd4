"""``SandboxEvent`` records: one per exec or file operation, keyed by episode id, on the ``sandbox-events`` topic.

Each sandbox numbers its operations 0, 1, 2, ... in the order their records are sent; a record is acknowledged by
the bus before the operation returns. A record the bus refuses is logged as an error and its sequence number stays
used, so a gap in a sandbox's sequence marks exactly the operations whose records were lost.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Literal

from orchard.bus import BusError, Producer
from orchard.codec import Codec
from orchard.logging import get_logger
from orchard.sandbox import SandboxSpec
from orchard.topics import SANDBOX_EVENTS

Operation = Literal["EXEC", "WRITE_FILE", "READ_FILE", "LIST_FILES", "APPLY_PATCH", "DELETE_FILE", "UPLOAD", "DOWNLOAD"]

log = get_logger("orchard.sandbox.events")


@dataclass(frozen=True)
class OperationRecord:
    """What one operation did, before it is numbered and encoded."""

    operation: Operation
    command_or_path: str
    started_ms: int
    duration_ms: float
    exit_code: int | None = None
    output_sha256: str = ""
    output_bytes: int = 0

    @classmethod
    def of_output(
        cls,
        operation: Operation,
        command_or_path: str,
        started_ms: int,
        duration_ms: float,
        output: bytes,
        exit_code: int | None = None,
    ) -> OperationRecord:
        """A record whose digest and size are those of ``output`` (no digest when it is empty)."""
        digest = hashlib.sha256(output).hexdigest() if output else ""
        return cls(operation, command_or_path, started_ms, duration_ms, exit_code, digest, len(output))


class SandboxEventPublisher:
    """Encodes and sends one sandbox's events in sequence; thread-safe; a no-op without a producer."""

    def __init__(
        self,
        spec: SandboxSpec,
        producer: Producer | None,
        *,
        producer_lock: threading.Lock | None = None,
        topic: str = SANDBOX_EVENTS,
    ) -> None:
        """``producer`` may be shared by many sandboxes: pass the same ``producer_lock`` to each, since bus
        producers buffer records and are not safe to call from several threads at once."""
        self.spec, self.producer, self.topic = spec, producer, topic
        self._producer_lock = producer_lock or threading.Lock()
        self._sequence = 0
        self._lock = threading.Lock()
        self._codec = Codec.default() if producer is not None else None

    @property
    def sequence(self) -> int:
        """The next sequence number."""
        return self._sequence

    def publish(self, record: OperationRecord) -> None:
        """Number, encode and send ``record`` (waits for the bus's acknowledgement)."""
        if self.producer is None or self._codec is None:
            return
        with self._lock:
            sequence = self._sequence
            self._sequence += 1
            value = self._codec.encode("SandboxEvent", self._fields(record, sequence))
            try:
                with self._producer_lock:
                    self.producer.send(self.topic, value, key=self.spec.episode_id.encode())
            except BusError as exc:
                log.error(
                    "sandbox_event_lost",
                    sandbox=self.spec.sandbox_id,
                    episode=self.spec.episode_id,
                    sequence=sequence,
                    operation=record.operation,
                    error=str(exc),
                )

    def _fields(self, record: OperationRecord, sequence: int) -> dict[str, object]:
        return {
            "run_id": self.spec.run_id,
            "episode_id": self.spec.episode_id,
            "sandbox_id": self.spec.sandbox_id,
            "sequence": sequence,
            "operation": record.operation,
            "command_or_path": record.command_or_path,
            "exit_code": record.exit_code,
            "duration_ms": float(record.duration_ms),
            "output_sha256": record.output_sha256,
            "output_bytes": record.output_bytes,
            "timestamp": record.started_ms,
        }
