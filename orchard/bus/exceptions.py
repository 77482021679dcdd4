"""Errors raised by ``orchard.bus``; backend errors are wrapped with ``from exc``."""

from orchard.exceptions import OrchardError


class BusError(OrchardError):
    """Base class of bus errors."""


class BusUnavailableError(BusError):
    """No broker answered in time, or the embedded log directory cannot be used."""


class TopicNotFoundError(BusError):
    """The topic does not exist (topics are never created implicitly)."""


class TopicExistsError(BusError):
    """A topic of that name already exists."""


class RecordTooLargeError(BusError):
    """A record is larger than the bus accepts; raised before anything is sent."""


class DeliveryError(BusError):
    """One or more produced records were not acknowledged."""


class TransactionError(BusError):
    """A transaction could not be committed; nothing of it is visible."""


class TransactionPendingError(BusError):
    """A transaction is committed but could not be fully applied yet; it completes on the next open of the bus
    (or with the next producer of the same transactional id). Do not retry it: that would write it twice."""


class MemberFencedError(BusError):
    """A static group member was fenced: another consumer joined with its ``group.instance.id``, or (librdkafka
    issue #3437) this one rejoined after a session time-out while its old membership was still being answered.

    ``by_another`` says which, as the group's coordinator saw it after the fence: True when a different consumer
    holds the instance id now, False when this consumer still does (or nobody), None when the group could not be
    described."""

    def __init__(self, message: str, *, by_another: bool | None = None) -> None:
        super().__init__(message)
        self.by_another = by_another


class ConsumerClosedError(BusError):
    """The consumer was used after ``close()``."""
