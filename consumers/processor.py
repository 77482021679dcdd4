"""The contract between a stream processor and the consumer runtime that runs it.

A processor is pure logic over decoded records: it never opens a bus. The runtime (``consumers.runtime``)
polls its input topics in its own consumer group, decodes each record, calls ``process``, and commits, in one
transaction, what the processor emitted, the changes it made to its state store, and the input offsets.
So after a crash a processor resumes with its state exactly as of the last committed input: nothing lost,
nothing emitted twice.

Rules a processor keeps so replays are deterministic:

- every output field derives from inputs (time fields from ``Input.timestamp_ms`` or record fields,
  never from the wall clock); ``punctuate`` receives the runtime's notion of now (stream time in replays);
- all state that must survive a restart lives in the ``StateStore`` (in-memory indexes are rebuilt in ``open``);
- a record it cannot use is rejected by raising ``RecordRejected(reason)``: the runtime sends the input record
  to the dead-letter topic with that reason and carries on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from orchard.exceptions import OrchardError


class RecordRejected(OrchardError):
    """Raised by a processor for an input it cannot process; the record goes to the dead-letter topic."""

    def __init__(self, reason: str, error_type: str = "rejected") -> None:
        """``reason`` is what the dead letter says; ``error_type`` classifies it."""
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type


@dataclass(frozen=True, slots=True)
class Input:
    """One decoded input record."""

    topic: str  # the logical topic name (a replay namespace prefix is stripped)
    schema: str  # the record's schema name, e.g. "ModelCall"
    record: Mapping[str, Any]
    key: bytes | None
    timestamp_ms: int
    partition: int
    offset: int
    value: bytes = b""  # the record's encoded bytes as read (lets a processor keep or forward it without re-encoding)


class Emit(Protocol):
    """Queue one output record (committed with the input that caused it)."""

    def __call__(self, topic: str, schema: str, record: Mapping[str, Any], key: str | bytes | None = None) -> None:
        """``topic`` is a logical name; in a replay the runtime writes to ``<namespace>.<topic>``."""


class StateStore(Protocol):
    """Durable key-value state of one processor instance (a changelog topic behind it)."""

    def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None."""

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (committed with the current input)."""

    def put_input(self, key: str, message: Input, prefix: bytes = b"") -> None:
        """Store ``prefix + message.value`` under ``key``: the input record kept as read, which the store may
        persist as a reference to the record's place in its input topic rather than as a second copy. Only for
        inputs of a topic that is never compacted and outlives the key (``model-calls``, ``episode-outcomes``)."""

    def delete(self, key: str) -> None:
        """Forget ``key``."""

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every key and value (used by ``open`` to rebuild in-memory indexes)."""

    def home(self, key: str) -> int | None:
        """The input partition whose state ``key`` belongs to (None: not stored, or a store without partitions)."""

    def at_partition(self, partition: int | None) -> AbstractContextManager[None]:
        """Within it, changes belong to the state of input ``partition`` (None: of the input being processed).

        A change normally belongs to the partition of the input being processed. A timer that fires while another
        partition's input is processed (a wait or a group timing out) changes the state of the partition it was
        set for: with several instances, only that partition's owner restores it."""


class Processor(ABC):
    """A stream processor: a consumer group's logic. Subclasses set the class attributes and ``process``."""

    name: ClassVar[str]  # the default consumer group (and ``orchard consumer run NAME``)
    input_topics: ClassVar[tuple[str, ...]]
    output_topics: ClassVar[tuple[str, ...]]

    def open(self, state: StateStore) -> None:  # noqa: B027 - optional hook
        """Called once the state store is restored, before the first ``process``."""

    @abstractmethod
    def process(self, message: Input, emit: Emit) -> None:
        """Handle one input record; emit outputs and update state as needed."""

    def punctuate(self, now_ms: int, emit: Emit) -> None:  # noqa: B027 - optional hook
        """Called periodically (after each poll): emit what timed out."""
